"""inventory.fast_sql with its switch on and off: each telemetry write leaves the same rows either way.

The ORM forms are the fast path's own fallback (`FAST_PATHS["telemetry_sql"]`
off). Rows are generated (hypothesis): GPUs with and without earlier
samples, stored minutes that a merge adds to and new ones, nodes with and
without a replay mark. Each example writes once with the switch on and once
off, each in a savepoint rolled back after, and compares the tables, and
with what the rows should hold, worked out here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import pytest
from django.conf import settings
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st

from common import fastpaths
from inventory import fast_sql
from inventory.models import Gpu, GpuMinute, Node, NodePool
from tests.examples import SQL_EXAMPLES, counts, effect, moments, rolled_back, texts

pytestmark = pytest.mark.django_db
T = TypeVar("T")

floats = st.floats(allow_nan=False, allow_infinity=False)
# Sums and maxima stay clear of overflow: Postgres refuses an infinite sum where Python makes one.
readings = st.floats(-1e9, 1e9, allow_nan=False)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | floats | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)


@contextmanager
def _switched(fast: bool) -> Iterator[None]:
    """Run the block with the fast path `telemetry_sql` on (`fast`) or off (its ORM forms serve)."""
    with override_settings(FAST_PATHS={**settings.FAST_PATHS, fastpaths.TELEMETRY_SQL: fast}):
        yield


def _effect_both(write: Callable[[], object], read: Callable[[], T]) -> tuple[T, T]:
    """Return what `read` finds after `write` with the fast path on, then off; each in a savepoint rolled back."""
    with _switched(True):
        on = effect(write, read)
    with _switched(False):
        return on, effect(write, read)


def _nodes(count: int) -> list[Node]:
    pool = NodePool.objects.create(name="p")
    return [Node.objects.create(name=f"n{i}", pool=pool) for i in range(count)]


def _gpus(count: int) -> list[Gpu]:
    node = _nodes(1)[0]
    return Gpu.objects.bulk_create(Gpu(node=node, index=i, uuid=f"G{i}", model="H100") for i in range(count))


# --- latest samples -------------------------------------------------------------------------

samples = st.tuples(st.none() | floats, st.none() | counts, st.dictionaries(texts, json_values, max_size=4))


@SQL_EXAMPLES
@given(
    before=st.lists(st.none() | samples, min_size=1, max_size=5),
    latest=st.dictionaries(st.integers(0, 5), samples, min_size=1),
    at=moments,
)
def test_store_gpu_samples(
    db: None, before: list[fast_sql.Sample | None], latest: dict[int, fast_sql.Sample], at: datetime
) -> None:
    with rolled_back():
        gpus = _gpus(len(before))
        earlier_at = datetime(2000, 1, 1, tzinfo=UTC)
        for gpu, earlier in zip(gpus, before, strict=True):
            if earlier is not None:
                utilization, memory, reported = earlier
                Gpu.objects.filter(pk=gpu.pk).update(
                    utilization=utilization, memory_used_mib=memory, last_sample=reported, last_sample_at=earlier_at
                )
        # An index past the GPUs made names no GPU: nothing to update.
        by_id = {gpus[i].pk if i < len(gpus) else 10**9: sample for i, sample in latest.items()}

        def stored() -> list[tuple[Any, ...]]:
            fields = ("pk", "utilization", "memory_used_mib", "last_sample", "last_sample_at")
            return list(Gpu.objects.order_by("pk").values_list(*fields))

        on, off = _effect_both(lambda: fast_sql.store_gpu_samples(by_id, at), stored)
        assert on == off
        # Each GPU in the batch has its sample and `at`; the others keep theirs.
        assert [row[-1] for row in on] == [
            at if i in latest else (None if before[i] is None else earlier_at) for i in range(len(gpus))
        ]


# --- minutes --------------------------------------------------------------------------------


@st.composite
def partials(draw: st.DrawFn) -> tuple[Any, ...]:
    """Return a rollup partial's values after (GPU, minute): samples, sums, maxima, some unknown."""
    samples = draw(st.integers(1, 10_000))
    return (
        samples,
        draw(readings),
        draw(readings),
        draw(st.none() | st.integers(0, 10**6)),
        draw(st.integers(0, samples)),
        draw(readings),
        draw(st.none() | readings),
    )


# How a stored minute and a partial combine: these add up, the others take the greater known value.
ADDED = ("samples", "utilization_sum", "power_samples", "power_sum")
GREATEST = ("utilization_max", "memory_used_max_mib", "temperature_max")
minute_keys = st.tuples(st.integers(0, 2), st.sampled_from([0, 60, 1_700_000_000, 1_700_000_060, 4_102_444_800]))


@SQL_EXAMPLES
@given(
    stored=st.dictionaries(minute_keys, partials(), max_size=5),
    merged=st.dictionaries(minute_keys, partials(), min_size=1, max_size=5),
)
def test_merge_gpu_minutes(
    db: None, stored: dict[tuple[int, int], tuple[Any, ...]], merged: dict[tuple[int, int], tuple[Any, ...]]
) -> None:
    with rolled_back():
        gpus = _gpus(3)
        for (gpu, minute), values in stored.items():
            GpuMinute.objects.create(**_minute(gpus[gpu].pk, minute, values))
        rows = [(gpus[gpu].pk, minute, *values) for (gpu, minute), values in sorted(merged.items())]

        def minutes() -> list[dict[str, Any]]:
            return list(GpuMinute.objects.order_by("gpu_id", "minute").values(*fast_sql.MINUTE_FIELDS))

        on, off = _effect_both(lambda: fast_sql.merge_gpu_minutes(rows), minutes)
        assert on == off
        assert on == [
            _merged(gpus[gpu].pk, minute, stored.get((gpu, minute)), merged.get((gpu, minute)))
            for gpu, minute in sorted({*stored, *merged})
        ]


def _minute(gpu_id: int, minute: int, values: Any) -> dict[str, Any]:
    return {
        "gpu_id": gpu_id,
        "minute": datetime.fromtimestamp(minute, UTC),
        **dict(zip(fast_sql.MINUTE_FIELDS[2:], values, strict=True)),
    }


def _merged(gpu_id: int, minute: int, old: tuple[Any, ...] | None, new: tuple[Any, ...] | None) -> dict[str, Any]:
    """Return the minute a merge leaves from what was stored (`old`) and the partial merged (`new`), either None."""
    values = dict(zip(fast_sql.MINUTE_FIELDS[2:], old or new or (), strict=True))
    if old is not None and new is not None:
        partial = dict(zip(fast_sql.MINUTE_FIELDS[2:], new, strict=True))
        values |= {name: values[name] + partial[name] for name in ADDED}
        values |= {name: _greatest(values[name], partial[name]) for name in GREATEST}
    return {"gpu": gpu_id, "minute": datetime.fromtimestamp(minute, UTC), **values}


def _greatest(old: Any, new: Any) -> Any:
    known = [value for value in (old, new) if value is not None]
    return max(known) if known else None


# --- replay marks ---------------------------------------------------------------------------


@SQL_EXAMPLES
@given(
    marks=st.lists(st.none() | floats, min_size=1, max_size=5),
    newest=st.dictionaries(st.integers(0, 5), floats, min_size=1),
)
def test_advance_rollup_marks(db: None, marks: list[float | None], newest: dict[int, float]) -> None:
    with rolled_back():
        nodes = _nodes(len(marks))
        for node, mark in zip(nodes, marks, strict=True):
            Node.objects.filter(pk=node.pk).update(samples_rolled_up_until=mark)
        until = {nodes[i].pk if i < len(nodes) else 10**9: value for i, value in newest.items()}

        def stored() -> list[tuple[Any, ...]]:
            return list(Node.objects.order_by("pk").values_list("pk", "samples_rolled_up_until"))

        on, off = _effect_both(lambda: fast_sql.advance_rollup_marks(until), stored)
        assert on == off
        assert [mark for _, mark in on] == [
            _greatest(mark, newest[i]) if i in newest else mark for i, mark in enumerate(marks)
        ]
