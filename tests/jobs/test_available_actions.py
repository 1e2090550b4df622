"""Which actions a user may take on a workload now: the one rule's table (states x kinds x roles), the API's
`actions` field for each persona, and the workload page's buttons drawn from the same answer."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import Workload
from jobs.services.available import ACTIONS, available_actions
from tenants.choices import Role
from tests.conftest import World, client_for
from tests.frontend.test_pages import logged_in
from tests.frontend.test_workload_pages import _set, _submit, detail, team  # noqa: F401  # `team` is a fixture

S, K = WorkloadState, WorkloadKind
OWNER, OTHER = 7, 8
# What the state allows to whoever may act, written out here rather than read from the services.
ENDED = {"restart"}
BY_STATE: dict[tuple[str, str], set[str]] = {
    **{(K.JOB, state): {"cancel"} for state in (S.PENDING, S.SCHEDULED, S.STARTING, S.RUNNING, S.HIBERNATED)},
    **{(kind, state): ENDED for kind in K for state in (S.SUCCEEDED, S.FAILED, S.CANCELLED, S.LOST)},
    **{(kind, S.PREEMPTED): {"cancel", "restart"} for kind in K},
    (K.NOTEBOOK, S.PENDING): {"cancel"},
    **{(K.NOTEBOOK, state): {"cancel", "hibernate"} for state in (S.SCHEDULED, S.STARTING, S.RUNNING)},
    (K.NOTEBOOK, S.HIBERNATED): {"cancel", "resume"},
}
# (role, viewer): whether they may act, and whether they may open a running notebook (the proxy's rule,
# `is_notebook_opener`: its owner while a member or admin, and the tenant's admins; an operator only as one of them).
VIEWERS: dict[str, tuple[Role | None, int | None, bool, bool]] = {
    "owner": (Role.MEMBER, OWNER, True, True),
    "other member": (Role.MEMBER, OTHER, False, False),
    "admin": (Role.ADMIN, OTHER, True, True),
    "operator": (Role.OPERATOR, OTHER, True, False),
    "viewer": (Role.VIEWER, OTHER, False, False),
    "owner now a viewer": (Role.VIEWER, OWNER, False, False),
    "nobody": (None, None, False, False),
}


def _workload(kind: str, state: str, **fields: Any) -> Workload:
    return Workload(pk=41, kind=kind, state=state, owner_id=OWNER, **fields)


@pytest.mark.parametrize("who", list(VIEWERS))
@pytest.mark.parametrize(("kind", "state"), list(BY_STATE))
def test_the_table_of_states_and_roles(who: str, kind: str, state: str) -> None:
    role, viewer, acts, opens = VIEWERS[who]
    expected = set(BY_STATE[kind, state]) if acts else set()
    if opens and kind == K.NOTEBOOK and state == S.RUNNING:
        expected.add("open")
    got = available_actions(_workload(kind, state), role=role, viewer_id=viewer)
    assert set(got) == expected
    assert got == [name for name in ACTIONS if name in got], "in the one order pages and clients list them"


def test_every_state_of_every_kind_is_in_the_table() -> None:
    assert set(BY_STATE) == {(kind, state) for kind in K for state in S}


def test_extend_is_offered_once_for_a_running_notebook_warned_as_idle() -> None:
    warned = timezone.now() - timedelta(minutes=5)

    def actions(kind: str, **fields: Any) -> list[str]:
        return available_actions(_workload(kind, S.RUNNING, **fields), role=Role.MEMBER, viewer_id=OWNER)

    assert actions(K.NOTEBOOK, idle_warned_at=warned) == ["cancel", "hibernate", "extend", "open"]
    assert "extend" not in actions(K.NOTEBOOK, idle_warned_at=warned, idle_extended_at=timezone.now())
    assert "extend" not in actions(K.NOTEBOOK)
    assert "extend" not in actions(K.JOB, idle_warned_at=warned)


API = "/api/v1/tenants/tenant-a/workloads/"


def _user(name: str) -> User:
    return User.objects.get(username=name)


def test_the_api_says_what_each_persona_may_do_and_outsiders_get_not_found(team: World) -> None:  # noqa: F811
    notebook = _set(_submit(team, name="lab", kind="notebook"), state=WorkloadState.RUNNING)
    job = _set(_submit(team, name="done"), state=WorkloadState.FAILED)
    seen = {
        name: {w.name: client_for(_user(name)).get(f"{API}{w.pk}/").json()["actions"] for w in (notebook, job)}
        for name in ("member_a", "admin_a", "other_a", "viewer_a", "operator")
    }
    assert seen == {
        "member_a": {"lab": ["cancel", "hibernate", "open"], "done": ["restart"]},  # the owner
        "admin_a": {"lab": ["cancel", "hibernate", "open"], "done": ["restart"]},
        "other_a": {"lab": [], "done": []},
        "viewer_a": {"lab": [], "done": []},
        "operator": {"lab": ["cancel", "hibernate"], "done": ["restart"]},  # the proxy lets operators in as admins only
    }
    assert client_for(team.admin_b).get(f"{API}{notebook.pk}/").status_code == 404


def _buttons(page: str, workload: Workload) -> set[str]:
    names = {
        name for name in ("cancel", "stop", "hibernate", "resume", "restart", "extend") if f'id="action-{name}"' in page
    }
    return names | ({"open"} if f'href="/notebooks/{workload.pk}/open' in page else set())


def test_the_page_offers_the_buttons_the_api_names(team: World) -> None:  # noqa: F811
    warned = timezone.now() - timedelta(minutes=5)
    workloads = [
        _submit(team, name="queued"),
        _set(_submit(team, name="running"), state=WorkloadState.RUNNING),
        _set(_submit(team, name="failed"), state=WorkloadState.FAILED),
        _set(_submit(team, name="idle", kind="notebook"), state=WorkloadState.RUNNING, idle_warned_at=warned),
        _set(_submit(team, name="asleep", kind="notebook"), state=WorkloadState.HIBERNATED),
    ]
    for name in ("member_a", "admin_a", "other_a", "viewer_a"):
        page, api = logged_in(name), client_for(_user(name))
        for workload in workloads:
            named = set(api.get(f"{API}{workload.pk}/").json()["actions"])
            # The page calls cancelling work that has started Stop.
            if "cancel" in named and workload.state == WorkloadState.RUNNING:
                named = named - {"cancel"} | {"stop"}
            assert _buttons(page.get(detail(workload)).content.decode(), workload) == named, (name, workload.name)
