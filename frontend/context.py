"""Template context every page gets: the viewer's tenants for the switcher and whether they operate."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from frontend.selectors import tenants_for_switcher
from tenants.context import Actor


def navigation(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    actor = Actor(user=user)
    return {"switcher_tenants": tenants_for_switcher(actor), "viewer_is_operator": actor.is_operator}
