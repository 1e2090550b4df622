"""Run-time predictions learned from history: the most specific group of similar succeeded jobs, and the error."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from jobs import services
from jobs.choices import WorkloadState
from jobs.models import Workload
from jobs.services import predictions
from jobs.services.lifecycle import transition_workload
from tenants.context import Actor
from tests.conftest import World
from tests.jobs.factories import assign, ready_world, request

pytestmark = pytest.mark.django_db

IMAGE = "registry.example.com/team/train:1.0"


def _finished(
    world: World, seconds: float, *, owner: Any = None, image: str = IMAGE, gpus: int = 1, **fields: Any
) -> None:
    """Record a job of alpha that succeeded after running `seconds`."""
    now = timezone.now()
    Workload.all_tenants.create(
        tenant=world.tenant_a,
        project=world.project_a,
        owner=owner or world.member_a,
        name="done",
        image=image,
        pool=world.pool,
        gpus_per_replica=gpus,
        state=fields.pop("state", WorkloadState.SUCCEEDED),
        started_at=now - timedelta(seconds=seconds),
        finished_at=now,
        run_seconds=seconds,
        **fields,
    )


def _key(world: World, *, owner: Any = None, image: str = IMAGE, gpus: int = 1) -> predictions.WorkKey:
    return predictions.WorkKey(world.project_a.pk, (owner or world.member_a).pk, image, gpus, 1)


def test_the_most_specific_group_with_enough_runs_is_used(world: World) -> None:
    for seconds in (100, 110, 120):
        _finished(world, seconds)  # the same owner and image
    for seconds in (1000, 1100, 1200, 1300):
        _finished(world, seconds, owner=world.admin_a)  # the same image, another owner
    for seconds in (5000, 5000, 5000):
        _finished(world, seconds, owner=world.admin_a, image="other:1")

    mine = predictions.predict_runtimes([_key(world)])[_key(world)]
    theirs = predictions.predict_runtimes([_key(world, owner=world.viewer_a)])[_key(world, owner=world.viewer_a)]
    new_image = _key(world, owner=world.viewer_a, image="new:1")

    assert (mine.seconds, mine.basis) == (
        110,
        "Median of the last 3 succeeded runs of the same owner, image and GPU shape.",
    )
    assert theirs.seconds == 1000 and "same image and GPU shape" in theirs.basis, "median of the image's 7 runs"
    assert predictions.predict_runtimes([new_image])[new_image].seconds == 1150, "the shape's 10 runs"


def test_a_group_with_too_few_runs_gives_way_but_any_run_beats_none(world: World) -> None:
    _finished(world, 100)
    for seconds in (1000, 1000, 1000):
        _finished(world, seconds, owner=world.admin_a)
    assert predictions.predict_runtimes([_key(world)])[_key(world)].seconds == 1000, "4 runs of the image beat 1 own"

    only = _key(world, gpus=4)
    _finished(world, 300, gpus=4)
    assert predictions.predict_runtimes([only])[only].seconds == 300


def test_no_prediction_without_succeeded_history_of_the_shape(world: World) -> None:
    _finished(world, 100, state=WorkloadState.FAILED)
    _finished(world, 100, gpus=2)
    assert predictions.predict_runtimes([_key(world)]) == {}


def test_the_median_resists_one_run_that_hung(world: World) -> None:
    for seconds in (100, 100, 100, 100, 90_000):
        _finished(world, seconds)
    assert predictions.predict_runtimes([_key(world)])[_key(world)].seconds == 100


def test_a_submission_stores_its_prediction_and_a_notebook_none(world: World) -> None:
    ready_world(world)
    for seconds in (600, 700, 800):
        _finished(world, seconds)

    job = services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=request(world))
    notebook = services.submit_workload(
        actor=Actor(user=world.member_a), project=world.project_a, data=request(world, kind="notebook", name="nb")
    )

    job.refresh_from_db()
    notebook.refresh_from_db()
    assert (job.predicted_runtime_seconds, job.prediction_basis.startswith("Median of the last 3")) == (700, True)
    assert (notebook.predicted_runtime_seconds, notebook.prediction_basis) == (None, "")


def test_an_ending_job_records_its_run_time_and_the_prediction_error(world: World) -> None:
    started = timezone.now() - timedelta(seconds=150)
    job = Workload.all_tenants.create(
        tenant=world.tenant_a,
        project=world.project_a,
        owner=world.member_a,
        name="train",
        image=IMAGE,
        pool=world.pool,
        state=WorkloadState.RUNNING,
        started_at=started,
        attained_seconds=50,
        predicted_runtime_seconds=100,
    )

    assert transition_workload(
        workload_id=job.pk, from_states=[WorkloadState.RUNNING], to_state=WorkloadState.SUCCEEDED
    )

    job.refresh_from_db()
    assert job.run_seconds == pytest.approx(200, abs=5), "this attempt's 150 s and the 50 s an earlier one kept"
    assert job.prediction_error == pytest.approx(1.0, abs=0.05)


def test_a_failed_job_records_its_run_time_but_no_error(world: World) -> None:
    job = Workload.all_tenants.create(
        tenant=world.tenant_a,
        project=world.project_a,
        owner=world.member_a,
        name="train",
        image=IMAGE,
        pool=world.pool,
        state=WorkloadState.RUNNING,
        started_at=timezone.now() - timedelta(seconds=30),
        predicted_runtime_seconds=100,
    )
    transition_workload(workload_id=job.pk, from_states=[WorkloadState.RUNNING], to_state=WorkloadState.FAILED)
    job.refresh_from_db()
    assert job.run_seconds == pytest.approx(30, abs=5) and job.prediction_error is None


def test_waiting_jobs_without_history_learn_from_the_first_run_that_succeeds(world: World) -> None:
    assign(world.member_a, world.project_a)
    waiting = Workload.all_tenants.create(
        tenant=world.tenant_a, project=world.project_a, owner=world.member_a, name="w", image=IMAGE, pool=world.pool
    )
    running = Workload.all_tenants.create(
        tenant=world.tenant_a,
        project=world.project_a,
        owner=world.member_a,
        name="r",
        image=IMAGE,
        pool=world.pool,
        state=WorkloadState.RUNNING,
        started_at=timezone.now() - timedelta(seconds=400),
    )

    transition_workload(workload_id=running.pk, from_states=[WorkloadState.RUNNING], to_state=WorkloadState.SUCCEEDED)

    waiting.refresh_from_db()
    assert waiting.predicted_runtime_seconds == pytest.approx(400, abs=5)
    assert "same owner, image and GPU shape" in waiting.prediction_basis
