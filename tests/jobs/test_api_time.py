"""The workload API's time fields (issue 31): estimate, reservation, prediction and preemptions, within the tenant."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from jobs.models import Workload
from tests.conftest import World, client_for

URL = "/api/v1/tenants/tenant-a/workloads/"


def _waiting(world: World) -> Workload:
    start = timezone.now() + timedelta(hours=2)
    return Workload.all_tenants.create(
        tenant=world.tenant_a,
        project=world.project_a,
        owner=world.member_a,
        name="train",
        image="registry.example.com/train:1",
        pool=world.pool,
        gpus_per_replica=2,
        predicted_runtime_seconds=5400,
        prediction_basis="Median of the last 3 succeeded runs of the same owner, image and GPU shape.",
        preemptions=1,
        estimated_start_at=start,
        estimate_basis="When workload 7 ends, as predicted.",
        reserved_from=start,
        reserved_gpus=[{"node": "n1", "gpus": ["GPU-a", "GPU-b"]}],
    )


def test_detail_and_list_show_the_estimate_reservation_prediction_and_preemptions(world: World) -> None:
    workload = _waiting(world)
    viewer = client_for(world.viewer_a)

    detail = viewer.get(f"{URL}{workload.pk}/").json()
    listed = viewer.get(URL).json()["results"][0]

    for body in (detail, listed):
        assert body["estimate_basis"] == "When workload 7 ends, as predicted."
        assert workload.estimated_start_at is not None
        assert body["estimated_start_at"].startswith(str(workload.estimated_start_at.year))
        assert (body["predicted_runtime_seconds"], body["preemptions"]) == (5400, 1)
        assert body["prediction_basis"].startswith("Median of the last 3")
        assert body["reservation"]["replicas"] == [{"node": "n1", "gpus": ["GPU-a", "GPU-b"]}]
        assert body["reservation"]["from"] == body["estimated_start_at"]
        assert (body["run_seconds"], body["prediction_error"]) == (None, None)


def test_a_workload_without_a_reservation_says_null(world: World) -> None:
    workload = _waiting(world)
    Workload.all_tenants.filter(pk=workload.pk).update(reserved_from=None, reserved_gpus=[])
    assert client_for(world.member_a).get(f"{URL}{workload.pk}/").json()["reservation"] is None


def test_an_outsider_sees_neither_the_workload_nor_its_plan(world: World) -> None:
    workload = _waiting(world)
    outsider = client_for(world.admin_b)

    assert outsider.get(f"{URL}{workload.pk}/").status_code == 404
    assert outsider.get(f"/api/v1/tenants/tenant-b/workloads/{workload.pk}/").status_code == 404
    assert outsider.get("/api/v1/tenants/tenant-b/workloads/").json()["count"] == 0
