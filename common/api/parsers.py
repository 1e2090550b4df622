"""The API's one body parser: JSON, bounded in size and nesting before anything reads it.

DRF's JSONParser reads the request stream itself, past Django's
DATA_UPLOAD_MAX_MEMORY_SIZE check, and Python's json module recurses once
per nesting level: without bounds a large body is read whole into memory
and a deeply nested one ends in a RecursionError (a 500).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import IO, Any

from rest_framework import exceptions, parsers

from common.text import UNSTORABLE_MESSAGE, unstorable_paths

MAX_BODY_BYTES = 16 * 1024 * 1024
"""Far beyond the largest bulk submission; a longer body is a 413."""
MAX_DEPTH = 32
"""Nesting levels of objects and lists; the deepest real body (a bulk item's env) has 4."""


class BodyTooLarge(exceptions.APIException):
    status_code = 413
    default_detail = f"The body is larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB."
    default_code = "too_large"


class UnstorableText(exceptions.ParseError):
    """A body whose text nothing can store: a 400 naming each field (`common.api.errors` renders `fields`).

    A parse error rather than a ValidationError, so that no view mistakes it for its serializer's refusal
    and goes on to judge the (empty) data left behind.
    """

    def __init__(self, paths: list[str]) -> None:
        super().__init__(f"{paths[0]}: {UNSTORABLE_MESSAGE}", code="invalid_text")
        self.fields = {path: [exceptions.ErrorDetail(UNSTORABLE_MESSAGE, code="invalid_text")] for path in paths}


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser with MAX_BODY_BYTES and MAX_DEPTH, refusing text nothing can store (`common.text`)."""

    def parse(
        self, stream: IO[Any], media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> Any:
        if stream is None:
            return super().parse(stream, media_type, parser_context)
        raw = stream.read(MAX_BODY_BYTES + 1)
        if len(raw) > MAX_BODY_BYTES:
            raise BodyTooLarge()
        encoding = (parser_context or {}).get("encoding") or "utf-8"
        try:
            data = json.loads(raw.decode(encoding), parse_constant=_refuse_constant)
        except RecursionError as error:
            raise exceptions.ParseError(f"JSON parse error - nested deeper than {MAX_DEPTH} levels") from error
        except ValueError as error:
            raise exceptions.ParseError(f"JSON parse error - {error}") from error
        if depth(data) > MAX_DEPTH:
            raise exceptions.ParseError(f"JSON parse error - nested deeper than {MAX_DEPTH} levels")
        # Refused here, once for every view and serializer: such text would fail the database or every later read.
        if unstorable := unstorable_paths(data):
            raise UnstorableText(unstorable)
        return data


def _refuse_constant(name: str) -> Any:
    # NaN and Infinity are not JSON; DRF's parser refuses them too (its strict mode).
    raise ValueError(f"{name} is not valid JSON")


def depth(value: Any) -> int:
    """Return how many levels of objects and lists `value` nests (0 for a scalar), without recursing."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest
