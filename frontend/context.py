from typing import Any

from django.http import HttpRequest


def navigation(request: HttpRequest) -> dict[str, Any]:
    return {}
