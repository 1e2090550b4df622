"""A refused submission body answered with every failing field at once: the input shape's errors and the rules'.

The input serializer refuses what it cannot parse (a string for a number, a
name longer than its field) before the submission service sees anything,
so its errors alone would hide those of every other field. `with_rule_errors`
runs the service's own field rules (`jobs.services.spec.input_errors`) on the
fields that did parse and answers both together, each under its field path
(`name`, `items[2].image`). The rules stay the service's; nothing here
restates one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers
from rest_framework.exceptions import ErrorDetail

from jobs.api.serializers import WorkloadItemSerializer, resolve_references
from jobs.services.spec import input_errors

Flat = dict[str, list[ErrorDetail]]
_ITEM = re.compile(r"items\[(\d+)\]\.?(.*)")
# A part of a field (`env.HOME`, `command[2]`) is that field's error.
_FIELD_PART = re.compile(r"[.\[]")


def with_rule_errors(
    refused: serializers.ValidationError, body: Any, context: dict[str, Any], *, bulk: bool
) -> serializers.ValidationError:
    """Return the input serializer's refusal of `body` joined with the rules its parsed fields break.

    `refused` is what `validated_input` raised; the answer names each field
    path once with every rule it breaks. A body that is not an object (or a
    bulk whose `items` is not a list) gets `refused` back as it is.
    """
    flat = _flatten(refused.detail)
    raw = _raw_items(body, bulk=bulk)
    if raw is None:
        return refused
    prefix = "items[{index}]." if bulk else ""
    for index, item in enumerate(raw):
        where = prefix.format(index=index)
        failed = _failed_fields(flat, where)
        for path, errors in _item_rule_errors(item, failed, context, where).items():
            if path not in flat:
                flat[path] = errors
    return serializers.ValidationError(flat)


def _raw_items(body: Any, *, bulk: bool) -> list[Any] | None:
    if not isinstance(body, Mapping):
        return None
    items = body.get("items") if bulk else [body]
    return items if isinstance(items, list) else None


def _failed_fields(flat: Flat, where: str) -> set[str]:
    """Return the fields of the item at `where` (`items[2].` or ``) that the serializer refused."""
    return {_FIELD_PART.split(path[len(where) :], maxsplit=1)[0] for path in flat if path.startswith(where)}


def _item_rule_errors(item: Any, failed: set[str], context: dict[str, Any], where: str) -> Flat:
    """Return the rules the parsed fields of one item break, by field path under `where`."""
    if not isinstance(item, Mapping):
        return {}
    parsed = _parsed(item, failed)
    errors: Flat = {}
    try:
        resolve_references([parsed], context, "")
    except serializers.ValidationError as error:
        for name, messages in _flatten(error.detail).items():
            errors[f"{where}{name}"] = messages
            parsed.pop(name, None)
            failed.add(name)
    for name, found in input_errors(parsed, refused=failed).items():
        errors[f"{where}{name}"] = [_detail(error) for error in found]
    return errors


def _parsed(item: Mapping[str, Any], failed: set[str]) -> dict[str, Any]:
    """Return the item's fields the serializer took, as it took them (those it refused left out)."""
    fields = WorkloadItemSerializer().fields
    parsed: dict[str, Any] = {}
    for name, value in item.items():
        field = fields.get(name)
        if field is None or name in failed:
            continue
        try:
            parsed[name] = field.run_validation(value)
        except (serializers.ValidationError, DjangoValidationError):
            failed.add(name)  # refused alone though it was not reported: leave it to the serializer's word
    return parsed


def _detail(error: DjangoValidationError) -> ErrorDetail:
    return ErrorDetail(error.messages[0], code=error.code or "invalid")


def _flatten(detail: Any, path: str = "") -> Flat:
    """Return DRF's nested error detail as {field path: [errors]}, a list item's index in the path (`items[2].x`)."""
    if isinstance(detail, Mapping):
        flat: Flat = {}
        for name, nested in detail.items():
            # A list's items are reported by index (DRF's ListField keys them by int): `command[1]`.
            key = f"{path}[{name}]" if isinstance(name, int) else (f"{path}.{name}" if path else str(name))
            for sub, errors in _flatten(nested, key).items():
                flat.setdefault(sub, []).extend(errors)
        return flat
    if isinstance(detail, list) and any(isinstance(entry, Mapping | list) for entry in detail):
        flat = {}
        for index, entry in enumerate(detail):
            for sub, errors in _flatten(entry, f"{path}[{index}]").items():
                flat.setdefault(sub, []).extend(errors)
        return flat
    entries = detail if isinstance(detail, list) else [detail]
    return {path or "non_field_errors": [ErrorDetail(str(e), code=getattr(e, "code", "invalid")) for e in entries]}
