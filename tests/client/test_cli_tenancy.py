"""What `gpc quota` and `gpc usage` count, and that another tenant's token sees none of it, by any command."""

from __future__ import annotations

import json

import pytest
from gpucloud_client import ApiError, Client, ClientError, Context

from jobs.choices import WorkloadState
from jobs.models import Workload
from tests.client.conftest import GPUS, Gpc, Platform, new_token, reached
from tests.workers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

IMAGE = "registry.example.com/team/train:1.0"


def _submit(gpc: Gpc, name: str, gpus: int) -> int:
    argv = ("-o", "json", "submit", "--image", IMAGE, "--pool", "shared", "--gpus", str(gpus), name)
    done = gpc(*argv, "--", "sh", "-c", "echo secret-of-a; sleep 60")
    assert done.returncode == 0, done.stderr
    workload_id: int = json.loads(done.stdout)["id"]
    return workload_id


def _cells(table: str, first: str) -> list[str]:
    rows = [line.split() for line in table.splitlines() if line.split()[:1] == [first]]
    assert len(rows) == 1, table
    return rows[0]


def test_quota_and_usage_count_what_the_tenant_holds_and_waits_for(platform: Platform) -> None:
    gpc = platform.member
    held = _submit(gpc, "held", 1)
    reached(held, WorkloadState.RUNNING)
    queued = _submit(gpc, "queued", GPUS)  # one GPU of the node is taken: it waits
    assert wait_until(lambda: Workload.all_tenants.get(pk=queued).reason_code), "the scheduler said why it waits"

    uses = {use["project"]: use for use in json.loads(gpc("-o", "json", "usage").stdout)["quotas"]}
    assert set(uses) == {None, "alpha"}
    tenant, alpha = uses[None], uses["alpha"]
    assert (tenant["pool"], tenant["guaranteed"], tenant["limit"]) == ("shared", 8, 16)
    assert (tenant["in_use"], tenant["running"], tenant["pending"], tenant["borrowed"]) == (1, 1, 1, 0)
    assert (alpha["limit"], alpha["in_use"], alpha["running"], alpha["pending"]) == (4, 1, 1, 1)
    table = gpc("usage").stdout
    assert _cells(table, "(tenant)")[:3] == ["(tenant)", "shared", "1/16"]
    assert _cells(table, "alpha")[:3] == ["alpha", "shared", "1/4"]

    quota = gpc("quota")
    assert quota.returncode == 0, quota.stderr
    assert _cells(quota.stdout, "(tenant)")[:4] == ["(tenant)", "shared", "8", "16"]
    assert _cells(quota.stdout, "alpha")[1] == "shared" and "4" in _cells(quota.stdout, "alpha")[2:4]
    quotas = json.loads(gpc("-o", "json", "quota").stdout)
    assert [(q["pool"], q["limit"]) for q in quotas["tenant"]] == [("shared", 16)]
    assert [(q["project"], q["limit"]) for q in quotas["projects"]] == [("alpha", 4)]
    assert gpc("cancel", str(held), str(queued)).returncode == 0


def test_another_tenants_token_sees_none_of_tenant_as_workloads(platform: Platform) -> None:
    world = platform.world
    held = _submit(platform.member, "held", 1)
    reached(held, WorkloadState.RUNNING)
    assert wait_until(lambda: "secret-of-a" in platform.member("logs", str(held)).stdout)

    outsider = Gpc(platform.member.config.with_name("outsider.yaml"))
    outsider.login(platform.url, new_token(world.admin_b, world.tenant_b))
    assert json.loads(outsider("-o", "json", "ls", "--all").stdout) == []
    assert outsider("ls", "--all").stdout.strip().splitlines()[1:] == []
    for argv in (("describe",), ("logs",), ("logs", "-f"), ("cancel",), ("-o", "json", "describe")):
        refused = outsider(*argv, str(held))
        assert refused.returncode == 5, (argv, refused.stderr)
        assert "secret-of-a" not in refused.stdout + refused.stderr and "held" not in refused.stdout
    # Naming tenant A outright gets no further: the token is tenant B's.
    assert outsider("--tenant", "tenant-a", "ls").returncode == 5

    token_b = outsider.secrets[0]
    with Client(Context(name="b", url=platform.url, token=token_b, tenant="tenant-b")) as client:
        assert client.workloads() == []
        with pytest.raises(ApiError) as missing:
            client.workload(held)
        assert missing.value.status == 404 and missing.value.exit_code == 5
        with pytest.raises(ClientError) as stream:
            next(client.follow_logs(held))
        assert stream.value.exit_code == 5
    assert Workload.all_tenants.get(pk=held).state == WorkloadState.RUNNING, "the outsider's cancel did nothing"
    assert platform.member("cancel", str(held)).returncode == 0


def test_volumes_ls_lists_what_the_members_workloads_mount_and_never_another_tenants(platform: Platform) -> None:
    gpc = platform.member
    held = _submit(gpc, "held", 1)
    reached(held, WorkloadState.RUNNING)  # its launch made the member's home and the project's volume
    found = json.loads(gpc("-o", "json", "volumes", "ls").stdout)
    mounted = {(v["kind"], v["mount_path"], v["can_write"]) for v in found}
    assert ("home", "/home/member_a", True) in mounted and ("project", "/projects/alpha", True) in mounted, found
    table = gpc("volumes", "ls")
    assert table.returncode == 0, table.stderr
    assert _cells(table.stdout, "home")[2] == "/home/member_a"
    assert _cells(table.stdout, "home")[-1] == "rw"

    outsider = Gpc(platform.member.config.with_name("outsider.yaml"))
    outsider.login(platform.url, new_token(platform.world.admin_b, platform.world.tenant_b))
    theirs = json.loads(outsider("-o", "json", "volumes", "ls").stdout)
    assert not {v["id"] for v in theirs} & {v["id"] for v in found}, "tenant B sees none of tenant A's volumes"
    assert all(v["mount_path"] != "/home/member_a" for v in theirs)
    assert gpc("cancel", str(held)).returncode == 0
