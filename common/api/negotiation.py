"""Content negotiation that refuses an empty `?format=` instead of ignoring it."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request


class StrictContentNegotiation(DefaultContentNegotiation):
    """DRF's negotiation; `format` given but empty is a 404 like any format the route does not render.

    DRF reads an empty `format` as none given and answers in the default
    format, though the schema lists the formats a route renders.
    """

    def select_renderer(self, request: Request, renderers: Any, format_suffix: str | None = None) -> Any:
        name = self.settings.URL_FORMAT_OVERRIDE
        if name and not format_suffix and request.query_params.get(name) == "":
            raise exceptions.NotFound("No such format: leave `format` out, or name one this route renders.")
        return super().select_renderer(request, renderers, format_suffix)
