"""Serializer fields every API input uses, so that no value reaches the database out of its range."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

# The range of a 32-bit integer column, the narrowest the models use: counts, seconds, MiB.
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
# Primary keys are 64-bit.
ID_MAX = 2**63 - 1


class Integer(serializers.IntegerField):
    """An integer within the narrowest integer column's range, unless the caller gives bounds of its own.

    DRF's IntegerField takes any size, and a value past a column's range
    fails in the database (an OverflowError on SQLite, a DataError on
    Postgres) instead of as a 400 naming the field. Every integer input of
    the API is this field (ruff bans the other), so the rule lives here.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("min_value", INT_MIN)
        kwargs.setdefault("max_value", INT_MAX)
        super().__init__(**kwargs)


class ObjectId(Integer):
    """The id of an object (a primary key): 1 to the largest 64-bit integer."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", ID_MAX)
        super().__init__(**kwargs)
