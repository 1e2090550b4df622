"""Every list endpoint answers in a pinned number of queries, however many rows it lists."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from inventory.models import Gpu, Node, NodeEvent, NodePool
from tenants import services
from tenants.context import Actor
from tenants.models import AuditEvent, Membership, Project, ProjectQuota, TenantQuota
from tests.conftest import World, client_for


def _projects(world: World, n: int, start: int = 0) -> None:
    Project.all_tenants.bulk_create(
        Project(tenant=world.tenant_a, slug=f"p{i}", name=f"P{i}") for i in range(start, start + n)
    )


def _members(world: World, n: int, start: int = 0) -> None:
    from django.contrib.auth.models import User

    users = User.objects.bulk_create(User(username=f"u{i}") for i in range(start, start + n))
    memberships = Membership.all_tenants.bulk_create(
        Membership(tenant=world.tenant_a, user=u, role="member") for u in users
    )
    for membership in memberships:
        membership.projects.add(world.project_a)


def _project_quotas(world: World, n: int, start: int = 0) -> None:
    projects = Project.all_tenants.bulk_create(
        Project(tenant=world.tenant_a, slug=f"q{i}", name="Q") for i in range(start, start + n)
    )
    ProjectQuota.all_tenants.bulk_create(
        ProjectQuota(tenant=world.tenant_a, project=p, pool=world.pool, guaranteed=0, limit=1) for p in projects
    )


def _tenant_quotas(world: World, n: int, start: int = 0) -> None:
    pools = NodePool.objects.bulk_create(NodePool(name=f"pool-{i}") for i in range(start, start + n))
    TenantQuota.all_tenants.bulk_create(TenantQuota(tenant=world.tenant_a, pool=p, limit=1) for p in pools)


def _tokens(world: World, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        services.create_token(
            actor=Actor(user=world.member_a), tenant=world.tenant_a, name=f"t{i}", role="viewer", expires_in_days=1
        )


def _audit(world: World, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        services.update_project(actor=Actor(user=world.admin_a), project=world.project_a, name=f"Alpha {i}")


def _pools(world: World, n: int, start: int = 0) -> None:
    NodePool.objects.bulk_create(NodePool(name=f"np-{i}") for i in range(start, start + n))


def _tenants(world: World, n: int, start: int = 0) -> None:
    from tenants.models import Tenant

    Tenant.objects.bulk_create(Tenant(slug=f"t-{i}", name="T") for i in range(start, start + n))


def _nodes(world: World, n: int, start: int = 0) -> None:
    nodes = Node.objects.bulk_create(
        Node(name=f"node-{i}", pool=world.pool, runtime="simulated", simulated_gpu_count=2, state="ready")
        for i in range(start, start + n)
    )
    Gpu.objects.bulk_create(
        Gpu(node=node, index=g, uuid=f"GPU-{node.name}-{g}", model="NVIDIA H100 80GB HBM3")
        for node in nodes
        for g in range(2)
    )
    NodeEvent.objects.bulk_create(
        NodeEvent(node=Node.objects.get_or_create(name="watched", pool=world.pool)[0], kind="k", message=f"m{i}")
        for i in range(start, start + n)
    )


def _workloads(world: World, n: int, start: int = 0) -> None:
    from jobs.services import submit_workloads
    from tests.jobs.factories import ready_world, request

    if start == 0:
        ready_world(world)
    submit_workloads(
        actor=Actor(user=world.admin_a),
        project=world.project_a,
        items=[request(world, name=f"w{i}") for i in range(start, start + n)],
    )


def _allowed_images(world: World, n: int, start: int = 0) -> None:
    from jobs.models import AllowedImage

    AllowedImage.objects.bulk_create(
        AllowedImage(tenant=tenant, pattern=f"registry.local/p{i}:*")
        for i in range(start, start + n)
        for tenant in (world.tenant_a, world.tenant_b, None)
    )


def _presets(world: World, n: int, start: int = 0) -> None:
    from jobs.models import LaunchPreset

    LaunchPreset.all_tenants.bulk_create(
        LaunchPreset(tenant=world.tenant_a, name=f"preset-{i}", image="busybox:1", pool=world.pool)
        for i in range(start, start + n)
    )


def _invitations(world: World, n: int, start: int = 0) -> None:
    """N invitations of tenant A, each on a project, and as many addressed to admin_b (by name, from new tenants)."""
    from datetime import timedelta

    from django.utils import timezone

    from tenants.models import Invitation, Tenant

    later = timezone.now() + timedelta(days=1)
    for i in range(start, start + n):
        invitation = Invitation.all_tenants.create(
            tenant=world.tenant_a, username=f"guest{i}", digest=f"a{i}", expires_at=later
        )
        invitation.projects.add(world.project_a)
        other = Tenant.objects.create(slug=f"other-{i}", name=f"Other {i}")
        Invitation.all_tenants.create(tenant=other, username="admin_b", digest=f"b{i}", expires_at=later)


# (url, who lists, how to add N rows, pinned query count)
LISTS: list[tuple[str, str, Callable[..., None], int]] = [
    ("/api/v1/tenants/tenant-a/projects/", "admin_a", _projects, 4),
    ("/api/v1/tenants/tenant-a/memberships/", "admin_a", _members, 5),
    ("/api/v1/tenants/tenant-a/invitations/", "admin_a", _invitations, 5),
    ("/api/v1/invitations/", "admin_b", _invitations, 3),
    ("/api/v1/tenants/tenant-a/quotas/", "admin_a", _tenant_quotas, 4),
    ("/api/v1/tenants/tenant-a/project-quotas/", "admin_a", _project_quotas, 4),
    ("/api/v1/tenants/tenant-a/tokens/", "admin_a", _tokens, 4),
    ("/api/v1/tenants/tenant-a/audit-events/", "admin_a", _audit, 4),
    ("/api/v1/audit-events/", "operator", _audit, 2),
    ("/api/v1/tenants/", "operator", _tenants, 2),
    ("/api/v1/node-pools/", "admin_a", _pools, 4),
    # Capacity asks every GPU holder (the jobs app's active allocations: one query).
    ("/api/v1/node-pools/", "operator", _nodes, 4),
    ("/api/v1/nodes/", "operator", _nodes, 2),
    ("/api/v1/gpus/", "operator", _nodes, 2),
    ("/api/v1/nodes/watched/gpus/", "operator", _nodes, 2),
    ("/api/v1/nodes/watched/events/", "operator", _nodes, 3),
    ("/api/v1/tokens/", "member_a", _tokens, 2),
    ("/api/v1/tenants/tenant-a/workloads/", "member_a", _workloads, 4),
    ("/api/v1/images/", "operator", _allowed_images, 2),
    ("/api/v1/tenants/tenant-a/images/", "member_a", _allowed_images, 4),
    ("/api/v1/tenants/tenant-a/presets/", "member_a", _presets, 4),
]


def _count(client: APIClient, url: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, response.content
    return len(queries)


@pytest.mark.parametrize(("url", "who", "grow", "pinned"), LISTS, ids=[f"{row[0]}-{row[2].__name__}" for row in LISTS])
def test_list_query_count_is_pinned_and_flat(world: World, url: str, who: str, grow: Any, pinned: int) -> None:
    client = client_for(getattr(world, who))
    grow(world, 5)
    few = _count(client, url)
    grow(world, 10, start=5)
    many = _count(client, url)
    assert (few, many) == (pinned, pinned)


def test_token_authenticated_project_list_query_count(world: World) -> None:
    issued = services.create_token(
        actor=Actor(user=world.admin_a), tenant=world.tenant_a, name="q", role="admin", expires_in_days=1
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    client.get("/api/v1/tenants/tenant-a/projects/")  # records last_used_at, at most once a minute
    _projects(world, 30)
    # token + owner + tenant + membership role (1), count (1), page (1)
    assert _count(client, "/api/v1/tenants/tenant-a/projects/") == 3


def test_audit_list_shows_events_of_the_tenant_only(world: World) -> None:
    _audit(world, 2)
    services.update_project(actor=Actor(user=world.admin_b), project=world.project_b, name="Beta 2")
    results = client_for(world.admin_a).get("/api/v1/tenants/tenant-a/audit-events/").json()["results"]
    assert {e["tenant"] for e in results} == {world.tenant_a.pk}
    assert AuditEvent.all_tenants.filter(tenant_id=world.tenant_b.pk).exists()


def test_log_page_query_count_is_pinned_and_flat(world: World) -> None:
    """A log page reads the workload and the chunks it needs (one query), however long the log."""
    from jobs.models import LogChunk, Workload

    workload = Workload.all_tenants.create(
        tenant=world.tenant_a, project=world.project_a, owner=world.member_a, name="w", image="i", pool=world.pool
    )

    def grow(n: int) -> None:
        start = Workload.all_tenants.get(pk=workload.pk).log_seq
        LogChunk.all_tenants.bulk_create(
            LogChunk(
                tenant=world.tenant_a,
                workload=workload,
                first_seq=start + 10 * i + 1,
                last_seq=start + 10 * i + 10,
                first_at=workload.submitted_at,
                last_at=workload.submitted_at,
                lines=[[start + 10 * i + j, "2025-01-01T00:00:00Z", "stdout", "x", 1, 0] for j in range(1, 11)],
            )
            for i in range(n)
        )
        Workload.all_tenants.filter(pk=workload.pk).update(log_seq=start + 10 * n)

    client = client_for(world.viewer_a)
    url = f"/api/v1/tenants/tenant-a/workloads/{workload.pk}/logs/"
    grow(5)
    few = (_count(client, url), _count(client, f"{url}?since=3&limit=20"))
    grow(50)
    many = (_count(client, url), _count(client, f"{url}?since=3&limit=20"))
    # tenant (1), role (1), workload (1), chunks (1)
    assert few == many == (4, 4)
