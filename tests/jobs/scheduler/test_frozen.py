"""`jobs.scheduler.frozen.schedule`: the core's decisions, computed with the collector kept off the snapshot."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from jobs.scheduler import core, frozen
from tests.jobs.scheduler.layouts import job, node, quota, running, snapshot


@pytest.fixture(autouse=True)
def _nothing_frozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def _busy_cluster() -> core.Snapshot:
    nodes = [node(f"n{i}", used=4) for i in range(4)]
    placed = [running(job(f"r{i}", "b", gpus=4), (f"n{i}", (0, 1, 2, 3))) for i in range(4)]
    pending = [job(f"w{i}", "a" if i % 2 else "b", gpus=1 + i % 3, at=float(i)) for i in range(12)]
    return snapshot(nodes, [quota("a", 8, 16), quota("b", 8, 16)], pending, running_now=placed)


def test_it_decides_exactly_what_the_core_decides() -> None:
    cluster = _busy_cluster()
    assert frozen.schedule(cluster) == core.schedule(cluster)


def test_nothing_stays_frozen_after_a_pass() -> None:
    frozen.schedule(_busy_cluster())
    assert gc.get_freeze_count() == 0


def test_the_snapshot_is_out_of_the_collectors_sight_during_the_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []

    def core_pass(snapshot: core.Snapshot) -> core.Decisions:
        seen.append(gc.get_freeze_count())
        return core.schedule(snapshot)

    monkeypatch.setattr(frozen, "core_schedule", core_pass)
    frozen.schedule(_busy_cluster())
    assert seen and seen[0] > 0


def test_objects_someone_else_froze_stay_frozen() -> None:
    gc.freeze()
    before = gc.get_freeze_count()
    frozen.schedule(_busy_cluster())
    # Unfreezing would empty the permanent generation; frozen objects other threads free leave it meanwhile.
    assert 0 < gc.get_freeze_count() <= before
