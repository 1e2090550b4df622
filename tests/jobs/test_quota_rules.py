"""jobs.services.quota_rules' reads that are the ORM's alone: the pending and notebook counts, against counting
in Python.

(Both were hand-written statements of the fast path `jobs_sql` until bench/fast_sql.py found the ORM's
best form as fast; docs/fastpaths.md.)
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.choices import WorkloadKind, WorkloadState
from jobs.services.quota_rules import _notebook_counts, _pending_counts
from tests.conftest import World
from tests.examples import SQL_EXAMPLES, rolled_back
from tests.jobs.test_fast_sql import STATES, _workloads, workloads

pytestmark = pytest.mark.django_db


@SQL_EXAMPLES
@given(made=workloads, asked=st.sets(st.tuples(st.integers(0, 2), st.integers(0, 1)), min_size=1))
def test_pending_counts(world: World, made: list[tuple[int, int, int, str, str]], asked: set[tuple[int, int]]) -> None:
    with rolled_back():
        projects, pools = _workloads(world, made)
        keys = {(projects[p].pk, pools[q].pk) for p, q in asked}
        made_keys = [((projects[p].pk, pools[q].pk), state) for p, _, q, _, state in made]
        assert _pending_counts(keys) == Counter(
            k for k, state in made_keys if state == WorkloadState.PENDING and k in keys
        )


@SQL_EXAMPLES
@given(
    made=workloads,
    asked=st.sets(st.tuples(st.integers(0, 2), st.integers(0, 1), st.integers(0, 1)), min_size=1),
    states=st.sets(st.sampled_from(STATES), min_size=1),
)
def test_notebook_counts(
    world: World, made: list[tuple[int, int, int, str, str]], asked: set[tuple[int, int, int]], states: set[str]
) -> None:
    with rolled_back():
        projects, pools = _workloads(world, made)
        owners = [world.member_a, world.admin_b]
        keys = {(projects[p].pk, owners[o].pk, pools[q].pk) for p, o, q in asked}
        notebooks = [
            (projects[p].pk, owners[o].pk, pools[q].pk)
            for p, o, q, kind, state in made
            if kind == WorkloadKind.NOTEBOOK and state in states
        ]
        assert _notebook_counts(keys, states=sorted(states)) == Counter(key for key in notebooks if key in keys)


def test_no_workload_counts_nothing(world: World) -> None:
    assert _pending_counts({(world.project_a.pk, world.pool.pk)}) == {}
    assert _notebook_counts({(world.project_a.pk, world.member_a.pk, world.pool.pk)}, states=STATES) == {}
