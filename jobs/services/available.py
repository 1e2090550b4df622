"""Which actions a user may take on a workload now: the one rule the pages, the API and (through the API) the CLI
show.

Reads only the workload row and the viewer's role, so it costs no query.
The services still check everything again when an action is asked for (a
page or a client may be stale); this says what to offer, from the same
state sets and the same rule on who may act that the services use.
"""

from __future__ import annotations

from jobs.choices import WorkloadKind, WorkloadState
from jobs.models import Workload
from jobs.services.actions import CANCELLABLE_STATES, HIBERNATABLE_STATES, RESTARTABLE_STATES, may_act
from jobs.services.hibernation import notebook_link
from jobs.services.idle import extendable
from tenants.choices import Role

# Every action, in the order pages and clients list them; each but `open` is `POST .../workloads/<id>/<name>/`
# (`cancel` stops a started workload), `open` is the workload's `notebook_url`.
ACTIONS: tuple[str, ...] = ("cancel", "hibernate", "resume", "restart", "extend", "open")


def _state_allows(workload: Workload) -> dict[str, bool]:
    notebook = workload.kind == WorkloadKind.NOTEBOOK
    return {
        "cancel": workload.state in CANCELLABLE_STATES,
        "hibernate": notebook and workload.state in HIBERNATABLE_STATES,
        "resume": notebook and workload.state == WorkloadState.HIBERNATED,
        "restart": workload.state in RESTARTABLE_STATES,
        "extend": extendable(workload),
    }


def available_actions(workload: Workload, *, role: Role | None, viewer_id: int | None) -> list[str]:
    """Return the names of the actions (of ACTIONS, in that order) the viewer may take on `workload` now.

    `role` is the viewer's role in the workload's tenant (None: none), `viewer_id`
    their user id. Acting needs a member's role on one's own workload or an
    admin's (an operator's) on any; `open` follows the notebook's hand-off
    rule (`notebook_link`, asking `is_notebook_opener`: its owner or the tenant's admins, while it runs).
    """
    allowed = []
    if role is not None and may_act(role, owner_id=workload.owner_id, viewer_id=viewer_id):
        allowed = [name for name, applies in _state_allows(workload).items() if applies]
    if notebook_link(workload, viewer_id=viewer_id, role=role) is not None:
        allowed.append("open")
    return allowed
