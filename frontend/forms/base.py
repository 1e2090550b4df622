"""What every form of the web UI shares: choices given at run time, and a service's errors put on the fields."""

from __future__ import annotations

import re

from django import forms
from django.core.exceptions import ValidationError

from common.errors import Conflict


def _choices(form: forms.Form, name: str, choices: list[tuple[str, str]]) -> None:
    field = form.fields[name]
    assert isinstance(field, forms.ChoiceField)
    field.choices = choices


# A service names a part of a field as `env.NAME` or `command[2]`: the part's error belongs to the field.
_FIELD_PART = re.compile(r"[.\[]")


def apply_service_errors(form: forms.Form, error: ValidationError | Conflict) -> None:
    """Put a service's error on the form: each field's messages next to that field (a part's next to
    its field), the rest on top."""
    if isinstance(error, Conflict):
        form.add_error(None, error.message)
        return
    if not hasattr(error, "error_dict"):
        form.add_error(None, error)
        return
    for field, errors in error.error_dict.items():
        owner = _FIELD_PART.split(field, maxsplit=1)[0]
        if owner in form.fields:
            form.add_error(owner, errors)
        else:
            form.add_error(None, [f"{field}: {message}" for e in errors for message in e.messages])
