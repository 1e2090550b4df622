"""Serializer fields that resolve references through scoped querysets only."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers


@extend_schema_field(OpenApiTypes.STR)
class ScopedSlugField(serializers.SlugRelatedField):
    """A slug reference resolved through `selector(context)` at validation time, never at import.

    An object outside the selector's queryset (another tenant's, say) is
    reported as not existing, exactly like a slug nobody uses.
    """

    def __init__(self, *, selector: Callable[[dict[str, Any]], QuerySet[Any]], **kwargs: Any) -> None:
        self.selector = selector
        kwargs.setdefault("slug_field", "slug")
        super().__init__(**kwargs)

    def get_queryset(self) -> QuerySet[Any]:
        return self.selector(self.context)

    def objects_named(self, slugs: Iterable[str], context: dict[str, Any]) -> dict[str, Any]:
        """Return {slug: object} for those of `slugs` this field resolves in `context`, in one query.

        For interfaces that resolve many requests' references together (the
        submission ingest); a slug missing from the answer is one the field
        would refuse as not existing.
        """
        lookup = {f"{self.slug_field}__in": set(slugs)}
        return {getattr(found, self.slug_field): found for found in self.selector(context).filter(**lookup)}
