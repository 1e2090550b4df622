"""List filters that refuse what the schema does not allow, instead of ignoring it.

django-filter reads a boolean `null`, `maybe` or an empty value, and an
empty date or choice, as "no filter", so a client that misspells a filter
gets every row back and believes it filtered. Every list endpoint's filters
are built on `StrictFilterSet` (explicit ones inherit it, generated ones
through `FilterBackend`): a value a filter cannot use is a 400 naming it.
"""

from __future__ import annotations

from typing import Any

import django_filters
from django import forms
from django.core.exceptions import ValidationError
from django.db import models
from django_filters.filterset import FILTER_FOR_DBFIELD_DEFAULTS
from django_filters.rest_framework import DjangoFilterBackend

_TRUE, _FALSE = frozenset({"true", "1"}), frozenset({"false", "0"})


class StrictBooleanField(forms.NullBooleanField):
    """true or false (also 1 and 0, any case); anything else is an error, not "no filter"."""

    widget = forms.TextInput  # NullBooleanSelect reads any unknown value as "unknown" before we see it

    def to_python(self, value: Any) -> bool | None:  # type: ignore[override]  # None: not given
        if value is None:
            return None
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValidationError("Must be true or false.", code="invalid")

    def validate(self, value: Any) -> None:
        return None


class StrictBooleanFilter(django_filters.BooleanFilter):
    field_class = StrictBooleanField


class StrictFilterSet(django_filters.FilterSet):
    """A FilterSet whose boolean filters are strict and whose non-text filters refuse an empty value."""

    FILTER_DEFAULTS = {**FILTER_FOR_DBFIELD_DEFAULTS, models.BooleanField: {"filter_class": StrictBooleanFilter}}

    def is_valid(self) -> bool:
        valid = super().is_valid()
        for name, definition in self.filters.items():
            if isinstance(definition, django_filters.CharFilter) or name not in self.data:
                continue
            if any(value == "" for value in self.data.getlist(name)):
                self.form.add_error(name, ValidationError("Must not be empty: leave it out instead.", code="blank"))
                valid = False
        return valid


class FilterBackend(DjangoFilterBackend):
    """DRF's django-filter backend, building the filters that views list by name on `StrictFilterSet`."""

    filterset_base = StrictFilterSet
