"""Hypothesis over the database: each example's rows live in a savepoint rolled back at its end.

The tests of the apps' hand-written SQL (tests/*/test_fast_sql.py) hold every
function to an ORM query computing the same thing, over rows hypothesis
generates. A test takes the `db` fixture (or one built on it) once; each
example writes its rows inside `rolled_back()`, so the next starts from
the same tables, on SQLite and Postgres alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TypeVar

from django.db import transaction
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

T = TypeVar("T")

# Few examples, each a handful of queries: the suite runs these on both databases.
SQL_EXAMPLES = settings(
    max_examples=30,
    deadline=None,
    # The fixtures' rows are shared by every example, which rolls back its own: that is the point.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Text both databases store as given: no NUL (Postgres refuses it), no lone surrogates (not UTF-8).
texts = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
# Moments the columns hold on both databases, microseconds included.
moments = st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(9999, 12, 30), timezones=st.just(UTC))
# What a PositiveIntegerField holds, its edges most of all.
counts = st.one_of(st.sampled_from([0, 1, 2**31 - 1]), st.integers(0, 100_000))


@contextmanager
def rolled_back() -> Iterator[None]:
    """Run the block in a savepoint that is rolled back when it ends."""
    with transaction.atomic():
        yield
        transaction.set_rollback(True)


def effect(write: Callable[[], object], read: Callable[[], T]) -> T:
    """Return what `read` finds after `write`; both run in a savepoint rolled back after."""
    with rolled_back():
        write()
        return read()
