"""JSON types and sizes, checked before DRF coerces them.

DRF's fields take `0` for a string, `"12"` and `12.0` for an integer and a
mapping for a list (its keys), so a client that sends the wrong type gets
its request carried out with something it did not mean, and the published
schema's types are not what the API enforces. `type_errors` holds a body
to the types of the serializer's fields, and bounds what a field leaves
unbounded (a string MAX_TEXT characters, a list MAX_ITEMS items);
`BaseViewSet.validated_input` reports them together with the serializer's
own errors.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import relations, serializers
from rest_framework.fields import SkipField, empty

MAX_TEXT = 64 * 1024
"""Characters of a string whose field sets no max_length (a command's argument, an env value)."""
MAX_ITEMS = 10_000
"""Items of a list whose field sets no max_length."""

# (field class, the JSON types it takes, what to tell the client); the first class that matches decides.
_RULES: list[tuple[type[Any], tuple[type, ...], str]] = [
    (serializers.BooleanField, (bool,), "Must be true or false."),
    (serializers.IntegerField, (int,), "Must be a whole number."),
    (serializers.FloatField, (int, float), "Must be a number."),
    (serializers.DecimalField, (int, float, str), "Must be a number."),
    (serializers.ChoiceField, (str,), "Must be a string: one of the choices."),
    (serializers.CharField, (str,), "Must be a string."),
    (serializers.DateTimeField, (str,), "Must be a date-time string."),
    (relations.PrimaryKeyRelatedField, (int,), "Must be an id (a whole number)."),
    (relations.SlugRelatedField, (str,), "Must be a string."),
]


def type_errors(serializer: Any, data: Any, prefix: str = "") -> dict[str, list[str]]:
    """Return {field path: [message]} for every value of `data` whose JSON type `serializer`'s field does not take."""
    if not isinstance(data, dict):
        return {}  # DRF reports a body that is not an object itself
    errors: dict[str, list[str]] = {}
    for name, field in serializer.fields.items():
        if field.read_only or field.source == "*" or name not in data:
            continue
        errors.update(_value_errors(field, data[name], f"{prefix}{name}"))
    return errors


def _value_errors(field: Any, value: Any, path: str) -> dict[str, list[str]]:
    if value is None:
        return {}  # allowed or not, DRF says so by the field's allow_null
    if isinstance(field, serializers.ListSerializer):
        return _list_errors(value, path, lambda item, where: _value_errors(field.child, item, where))
    if isinstance(field, serializers.BaseSerializer):
        if not isinstance(value, dict):
            return {path: ["Must be an object."]}
        return type_errors(field, value, f"{path}.")
    if isinstance(field, relations.ManyRelatedField):
        return _list_errors(value, path, lambda item, where: _value_errors(field.child_relation, item, where))
    if isinstance(field, serializers.ListField):
        return _list_errors(value, path, lambda item, where: _value_errors(field.child, item, where))
    if isinstance(field, serializers.DictField):
        if not isinstance(value, dict):
            return {path: ["Must be an object."]}
        found: dict[str, list[str]] = {}
        for key, item in value.items():
            found.update(_value_errors(field.child, item, f"{path}.{key}"))
        return found
    if isinstance(field, serializers.IntegerField) and isinstance(value, float) and value.is_integer():
        return {}  # 2.0 is an integer to JSON Schema too
    for kind, accepted, message in _RULES:
        if isinstance(field, kind):
            wrong = not isinstance(value, accepted) or (isinstance(value, bool) and bool not in accepted)
            if wrong:
                return {path: [message]}
            break
    if isinstance(value, str):
        # As sent: DRF measures after trimming, so whitespace around a value let it past its maxLength.
        longest = getattr(field, "max_length", None)
        if len(value) > (MAX_TEXT if longest is None else longest):
            return {path: [f"At most {MAX_TEXT if longest is None else longest} characters."]}
    return {}


def _list_errors(value: Any, path: str, check: Any) -> dict[str, list[str]]:
    if not isinstance(value, list):
        return {path: ["Must be a list."]}
    if len(value) > MAX_ITEMS:
        return {path: [f"At most {MAX_ITEMS} items."]}
    found: dict[str, list[str]] = {}
    for index, item in enumerate(value):
        found.update(check(item, f"{path}[{index}]"))
    return found


def accepted_values(serializer: Any, data: Any, *, refused: Collection[str]) -> dict[str, Any]:
    """Return {field: validated value} for each writable field of `serializer` not in `refused` that takes its value.

    For a serializer that refused some fields: a service's own rules can still
    judge the fields it accepted, so one answer names every failing field.
    A field left out of a partial body, or one that refuses its value, is not in the result.
    """
    given = data if isinstance(data, dict) else {}
    accepted: dict[str, Any] = {}
    for name, field in serializer.fields.items():
        if name in refused or field.read_only:
            continue
        try:
            accepted[name] = field.run_validation(given.get(name, empty))
        except (serializers.ValidationError, DjangoValidationError, SkipField):
            continue
    return accepted
