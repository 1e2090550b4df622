"""Domain errors that every app raises and every interface translates.

Services raise Django's ValidationError (field errors, 400) and
PermissionDenied (403); they raise these for the remaining cases so the API,
the UI and the CLI can answer each the same way.
"""

from __future__ import annotations

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
