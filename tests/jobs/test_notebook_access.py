"""Who may open a notebook: the rule (`may_open_notebook`) and the proxy's read of it (`notebook_proxy_target`).

The proxy's read is held to the rule computed here in Python from the rows
themselves, over rows hypothesis generates (two tenants, three users, any
roles, kinds, states, secrets and replicas), on SQLite and Postgres.
"""

from __future__ import annotations

from dataclasses import astuple
from typing import Any

import pytest
from django.contrib.auth.models import User
from hypothesis import given
from hypothesis import strategies as st

from inventory.models import Node
from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import Replica, Workload
from jobs.selectors import is_notebook_opener, may_open_notebook, notebook_proxy_target
from jobs.selectors.notebook_access import _read, notebook_access_rows
from tenants.choices import Role
from tenants.models import Membership, Tenant
from tests.conftest import World
from tests.examples import SQL_EXAMPLES, rolled_back

pytestmark = pytest.mark.django_db

STATES = [state.value for state in WorkloadState]
# The first of each choice lets a user reach a notebook, so that hypothesis's simplest examples do.
ROLES = [Role.ADMIN.value, Role.MEMBER.value, Role.VIEWER.value]
yes_no = st.sampled_from([True, False])
SERVES = "http://10.0.0.1:8888"
# A notebook's replicas: the endpoint of replica 0 of its current attempt (None: no such replica), and
# whether replica 1 of that attempt and replica 0 of another attempt are there, serving.
replicas = st.tuples(st.sampled_from([SERVES, "", None]), yes_no)
NOBODY = 10**9  # an id no row has


@pytest.mark.parametrize(
    ("owner", "role", "opens"),
    [
        (True, Role.MEMBER, True),
        (True, Role.ADMIN, True),
        (True, Role.VIEWER, False),  # an owner made a viewer no longer opens it
        (True, None, False),  # nor one removed from the tenant
        (True, Role.OPERATOR, False),  # an operator acts in every tenant, but opens no one's notebook as such
        (False, Role.ADMIN, True),  # the tenant's admins open anyone's
        (False, Role.MEMBER, False),
        (False, Role.OPERATOR, False),
    ],
)
def test_the_owner_while_a_member_and_the_tenants_admins_open_a_notebook(
    owner: bool, role: Role | None, opens: bool
) -> None:
    notebook = Workload(owner_id=1, kind=WorkloadKind.NOTEBOOK, state=WorkloadState.RUNNING, session_secret="s3cr3t")
    user_id = 1 if owner else 2
    assert is_notebook_opener(notebook, user_id=user_id, role=role) is opens
    assert may_open_notebook(notebook, user_id=user_id, role=role) is opens
    assert not is_notebook_opener(notebook, user_id=None, role=role), "an anonymous viewer opens nothing"


@pytest.mark.parametrize(
    ("kind", "state", "secret", "opens"),
    [
        (WorkloadKind.NOTEBOOK, WorkloadState.RUNNING, "s", True),
        (WorkloadKind.NOTEBOOK, WorkloadState.STARTING, "s", True),
        (WorkloadKind.NOTEBOOK, WorkloadState.PENDING, "s", False),
        (WorkloadKind.NOTEBOOK, WorkloadState.HIBERNATED, "s", False),
        (WorkloadKind.NOTEBOOK, WorkloadState.RUNNING, "", False),
        (WorkloadKind.JOB, WorkloadState.RUNNING, "s", False),
    ],
)
def test_only_a_starting_or_running_notebook_with_a_secret_opens(
    kind: str, state: str, secret: str, opens: bool
) -> None:
    workload = Workload(owner_id=1, kind=kind, state=state, session_secret=secret)
    assert may_open_notebook(workload, user_id=1, role=Role.ADMIN) is opens


def _workload(world: World, tenant: int, **fields: Any) -> Workload:
    project = (world.project_a, world.project_b)[tenant]
    made = {"owner": world.member_a, "name": "w", "image": "i"} | fields
    return Workload.all_tenants.create(tenant_id=project.tenant_id, project=project, pool=world.pool, **made)


def _expected(workload_id: int, user: User) -> tuple[str, str] | None:
    """The rule, read from the rows one by one: (endpoint, secret) where `user` reaches the notebook, else None."""
    workload = Workload.all_tenants.filter(pk=workload_id).select_related("tenant").first()
    if workload is None or not workload.tenant.is_active:
        return None
    membership = Membership.all_tenants.filter(tenant_id=workload.tenant_id, user=user).first()
    role = membership.role if membership is not None else None
    admits = role == Role.ADMIN or (workload.owner_id == user.pk and role in (Role.MEMBER, Role.ADMIN))
    serving = workload.kind == WorkloadKind.NOTEBOOK and workload.state in ("starting", "running")
    if not (admits and serving and workload.session_secret):
        return None
    first = Replica.all_tenants.filter(workload=workload, attempt=workload.attempt, index=0).first()
    if first is None or not first.endpoint:
        return None
    return first.endpoint, workload.session_secret


@SQL_EXAMPLES
@given(
    notebooks=st.lists(
        st.tuples(
            st.integers(0, 1),  # tenant
            st.integers(0, 2),  # owner
            st.sampled_from([WorkloadKind.NOTEBOOK.value, WorkloadKind.JOB.value]),
            st.sampled_from(STATES),
            st.sampled_from(["s3cr3t", ""]),  # session secret
            st.integers(1, 2),  # attempt
            replicas,
        ),
        min_size=1,
        max_size=4,
    ),
    roles=st.lists(st.sampled_from(ROLES) | st.none(), min_size=6, max_size=6),
    active=st.tuples(yes_no, yes_no),
)
def test_the_proxy_reaches_exactly_the_notebooks_the_rule_opens(
    world: World,
    notebooks: list[tuple[int, int, str, str, str, int, tuple[str | None, bool]]],
    roles: list[str | None],
    active: tuple[bool, bool],
) -> None:
    tenants = [world.tenant_a, world.tenant_b]
    users = [world.member_a, world.admin_b, world.operator]
    with rolled_back():
        Membership.all_tenants.all().delete()
        # roles[2 * user + tenant]: the user's role in that tenant, None for no membership.
        Membership.all_tenants.bulk_create(
            Membership(tenant=tenants[i % 2], user=users[i // 2], role=role) for i, role in enumerate(roles) if role
        )
        for row, is_active in zip(tenants, active, strict=True):
            Tenant.objects.filter(pk=row.pk).update(is_active=is_active)
        node = Node.objects.create(name="n", pool=world.pool)
        ids = [NOBODY]
        for tenant, owner, kind, state, secret, attempt, (endpoint, others) in notebooks:
            workload = _workload(
                world, tenant, owner=users[owner], kind=kind, state=state, session_secret=secret, attempt=attempt
            )
            ids.append(workload.pk)
            made = [(attempt, 0, endpoint)] if endpoint is not None else []
            made += [(attempt, 1, SERVES), (attempt + 1, 0, SERVES)] if others else []
            Replica.all_tenants.bulk_create(
                Replica(tenant=tenants[tenant], workload=workload, attempt=a, index=i, node=node, name="r", endpoint=e)
                for a, i, e in made
            )
        for workload_id in ids:
            for user in users:
                target = notebook_proxy_target(user, workload_id)
                found = None if target is None else (target.endpoint, target.secret)
                assert found == _expected(workload_id, user), (workload_id, user.username)


def test_the_compiled_statement_answers_as_the_queryset_it_was_compiled_from(world: World) -> None:
    """The proxy runs the queryset's statement compiled once, with its own values: never another user's row."""
    node = Node.objects.create(name="n", pool=world.pool)
    ids = [NOBODY]
    for tenant, owner in ((0, world.member_a), (0, world.admin_a), (1, world.admin_b)):
        notebook = _workload(
            world, tenant, owner=owner, kind=WorkloadKind.NOTEBOOK, state="running", session_secret="s"
        )
        tenant_row = (world.tenant_a, world.tenant_b)[tenant]
        Replica.all_tenants.create(
            tenant=tenant_row,
            workload=notebook,
            attempt=notebook.attempt,
            index=0,
            node=node,
            name="r",
            endpoint=SERVES,
        )
        ids.append(notebook.pk)
    for workload_id in ids:
        for user in (world.member_a, world.admin_a, world.viewer_a, world.admin_b, world.operator):
            fresh = [tuple(row) for row in notebook_access_rows(workload_id, user.pk)]
            read = _read(workload_id, user.pk)
            assert ([] if read is None else [astuple(read)]) == fresh, (workload_id, user.username)
