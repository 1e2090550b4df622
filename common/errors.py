"""Domain errors that every app raises and every interface translates.

Services raise Django's ValidationError (field errors, 400) and
PermissionDenied (403); they raise these for the remaining cases so the API,
the UI and the CLI can answer each the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError


class Conflict(Exception):
    """The request is well formed but clashes with the current state (409)."""

    def __init__(self, message: str, *, code: str = "conflict", details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        # Facts a client needs to recover, e.g. the current state of the object.
        self.details = details or {}


def invalid(field: str, code: str, message: str) -> ValidationError:
    """Return a ValidationError for one field, with a machine-readable rule code."""
    return ValidationError({field: [ValidationError(message, code=code)]})


FieldErrors = dict[str, list[ValidationError]]
"""Errors by field path (`name`, `env.HOME`, `items[2].image`), each a ValidationError with its rule code."""


def add_errors(errors: FieldErrors, error: ValidationError) -> None:
    """Add the field errors of `error` to `errors` (an error without a field goes under `non_field_errors`)."""
    found = error.error_dict if hasattr(error, "error_dict") else {"non_field_errors": error.error_list}
    for name, messages in found.items():
        errors.setdefault(name, []).extend(messages)


def gather(errors: FieldErrors, check: Callable[[], object]) -> None:
    """Run `check`; when it raises ValidationError, add its field errors to `errors` instead of stopping."""
    try:
        check()
    except ValidationError as error:
        add_errors(errors, error)


def raise_errors(errors: FieldErrors) -> None:
    """Raise one ValidationError naming every field in `errors`; return None when there are none."""
    if errors:
        raise ValidationError(errors)
