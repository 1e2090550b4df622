"""Field validation shared by the write services."""

from __future__ import annotations

from django.db import models


def clean_fields(obj: models.Model, *, exclude: list[str] | None = None) -> None:
    """Validate `obj`'s fields against their declared rules; raise ValidationError keyed by field.

    Uniqueness and multi-field rules are the services' own checks, with
    messages that say which rule failed.
    """
    obj.full_clean(exclude=exclude, validate_unique=False, validate_constraints=False)
