"""Serializer fields that resolve references through scoped querysets only."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from common.api.fields import Integer
from tenants.choices import MEMBERSHIP_ROLES
from tenants.models import NO_LIMIT


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


@extend_schema_field({"type": "string", "enum": [value for value, _ in MEMBERSHIP_ROLES]})
class MembershipRoleField(serializers.CharField):
    """A membership role by name. Only its shape is checked here: the service checks the name with the
    invitation's other fields, so that one answer reports every bad field at once."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 16)
        super().__init__(**kwargs)


class GpuLimitField(Integer):
    """A quota's GPU limit as the API shows it: null for no limit at this level (stored as NO_LIMIT)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("allow_null", True)
        kwargs.setdefault("read_only", True)
        super().__init__(**kwargs)

    def to_representation(self, value: int) -> int | None:  # type: ignore[override]  # null is this field's point
        return None if value >= NO_LIMIT else int(value)
