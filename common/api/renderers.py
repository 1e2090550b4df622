"""The API's JSON renderer: text that UTF-8 cannot carry (a row stored before input was checked) never fails a page."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import renderers

from common.text import replace_unencodable


def _replaced(data: Any) -> Any:
    """Return `data` with every string (keys included) passed through `replace_unencodable`."""
    if isinstance(data, str):
        return replace_unencodable(data)
    if isinstance(data, Mapping):
        return {_replaced(key): _replaced(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [_replaced(item) for item in data]
    return data


class JSONRenderer(renderers.JSONRenderer):
    """DRF's JSON renderer; a lone surrogate in the data is sent as U+FFFD rather than failing with a 500."""

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        try:
            return super().render(data, accepted_media_type, renderer_context)
        except UnicodeEncodeError:
            # Only a page holding bad text pays for the second pass.
            return super().render(_replaced(data), accepted_media_type, renderer_context)
