"""How far a workload's current attempt got on its way to running: the launch steps its page shows.

Every step is read from what the ledger recorded when it truly happened —
the attempt's events, its allocations, its replicas' `created_at`,
`started_at` and `ready_at` (the agent reports Jupyter's answer) — never
guessed: a step nothing recorded yet has no time. The runtime decides the
wording of the start step (a Docker node pulls a missing image as part of
it; a process node starts a process), and the Jupyter step exists only for
notebooks. A pull step ("Pulling image ...", between placed and starting)
exists only when a node really pulled: its replica's `pull_started_at`,
`pull_finished_at` and `pull_progress`, as the agent reported them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from inventory.choices import RuntimeKind
from jobs.choices import ACTIVE_STATES, ReasonCode, WorkloadKind, WorkloadState
from jobs.models import Allocation, Replica, Workload

# Reasons that mean "no free GPUs yet": running work ending frees what it waits for.
CAPACITY_REASONS = frozenset(
    {
        ReasonCode.NO_CAPACITY,
        ReasonCode.NO_CAPACITY_FOR_MODEL,
        ReasonCode.GANG_CANNOT_FIT,
        ReasonCode.BEHIND_QUEUE_HEAD,
        ReasonCode.WAITING_FOR_FAIRER_WORK,
        ReasonCode.WAITING_FOR_HIGHER_PRIORITY,
    }
)
# While a workload is in one of these states its page shows the launch steps.
STEP_STATES = frozenset({WorkloadState.PENDING, *ACTIVE_STATES})
_START_WORDS = {
    RuntimeKind.DOCKER: ("Starting the container", "the node pulls the image first if it does not have it"),
    RuntimeKind.PROCESS: ("Starting the process", "a local process on the node"),
    RuntimeKind.SIMULATED: ("Starting a simulated run", "nothing really runs on a simulated node"),
}


@dataclass(frozen=True)
class LaunchStep:
    """One step of a launch: `at` is when it was reached (None: not yet); `status` is done, current or next."""

    key: str
    label: str
    detail: str
    at: datetime | None
    status: str = "next"
    due: datetime | None = None


def attempt_began(workload: Workload) -> datetime:
    """Return when the current attempt joined the queue: its last move to pending, else the submission.

    Reads `workload.events` (prefetched by `workload_detail`), in the order they were written.
    """
    began = workload.submitted_at
    for event in workload.events.all():
        if event.to_state == WorkloadState.PENDING:
            began = event.created_at
    return began


def replicas_of_current_attempt(workload: Workload) -> list[Replica]:
    """Return the replicas of `workload`'s current attempt with their nodes, by index."""
    return list(
        Replica.objects.filter(workload=workload, attempt=workload.attempt).select_related("node").order_by("index")
    )


def current_launch_steps(workload: Workload, *, now: datetime) -> list[LaunchStep]:
    """Return `workload`'s launch steps as its page shows them at `now`: its replicas read, a wait bounded."""
    due = capacity_due(workload.pool_id, now=now) if workload.state == WorkloadState.PENDING else None
    return launch_steps(workload, replicas_of_current_attempt(workload), due=due)


def launch_steps(workload: Workload, replicas: Sequence[Replica], *, due: datetime | None = None) -> list[LaunchStep]:
    """Return the launch steps of `workload`'s current attempt, oldest first; [] outside STEP_STATES.

    `replicas` are the current attempt's (with nodes loaded); `due` is when
    GPUs of its pool come back at the latest (`capacity_due`), shown on the
    queued step while it waits for capacity. The last reached step is
    `current`, those before it `done`, the rest `next`.
    """
    if workload.state not in STEP_STATES:
        return []
    pulling = _pulling(replicas)
    steps = [
        _queued(workload, due),
        _placed(workload),
        *([pulling] if pulling is not None else []),
        _starting(replicas, pulled=pulling is not None),
    ]
    if workload.kind == WorkloadKind.NOTEBOOK:
        steps.append(_jupyter(replicas))
    ready = "Ready: JupyterLab answers" if workload.kind == WorkloadKind.NOTEBOOK else "Running"
    steps.append(LaunchStep("ready", ready, "", workload.started_at if workload.state == "running" else None))
    return _with_status(steps)


def _with_status(steps: list[LaunchStep]) -> list[LaunchStep]:
    reached = max((i for i, step in enumerate(steps) if step.at is not None), default=0)
    status = ["done" if i < reached else "current" if i == reached else "next" for i in range(len(steps))]
    return [dataclasses.replace(step, status=status[i]) for i, step in enumerate(steps)]


def _queued(workload: Workload, due: datetime | None) -> LaunchStep:
    if workload.state != WorkloadState.PENDING:
        return LaunchStep("queued", "Queued", "", attempt_began(workload))
    parts = [f"position {workload.queue_position} in pool {workload.pool.name}"] if workload.queue_position else []
    if workload.reason_code not in CAPACITY_REASONS:
        due = None  # what it waits for (a quota, a cordon) does not end when running work does
    elif due is None:
        parts.append("no expected start: the work running in the pool has no maximum runtime")
    return LaunchStep("queued", "Queued", "; ".join(parts), attempt_began(workload), due=due)


def _placed(workload: Workload) -> LaunchStep:
    if workload.scheduled_at is None:
        return LaunchStep("placed", "Placed on a node", "", None)
    held = [a for a in workload.allocations.all() if a.released_at is None]
    return LaunchStep("placed", f"Placed on {_nodes(held)}", _gpus(held), workload.scheduled_at)


def _nodes(held: Sequence[Allocation]) -> str:
    names = sorted({a.node.name for a in held})
    return f"node{'s' if len(names) > 1 else ''} {', '.join(names)}" if names else "a node"


def _gpus(held: Sequence[Allocation]) -> str:
    gpus = [a.gpu for a in held if a.gpu is not None]
    if not gpus:
        return "no GPU" if held else ""
    models = sorted({gpu.model for gpu in gpus})
    return f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''} ({', '.join(models)})"


def _starting(replicas: Sequence[Replica], *, pulled: bool) -> LaunchStep:
    """The start step; after a pull it begins when the last pull ended (unknown while one still runs)."""
    runtimes = {r.node.runtime for r in replicas}
    label, detail = (
        _START_WORDS.get(RuntimeKind(runtimes.pop()), ("Starting", ""))
        if len(runtimes) == 1
        else (
            "Starting the replicas",
            "",
        )
    )
    if not pulled:
        return LaunchStep("starting", label, detail, min((r.created_at for r in replicas), default=None))
    ends = [_pull_end(r) for r in replicas if r.pull_started_at is not None]
    began = None if any(end is None for end in ends) else max(end for end in ends if end is not None)
    return LaunchStep("starting", label, "the image is on the node now", began)


def _pulling(replicas: Sequence[Replica]) -> LaunchStep | None:
    """The pull step, or None when no replica's node had to pull its image."""
    pulls = [r for r in replicas if r.pull_started_at is not None]
    if not pulls:
        return None
    began = min(r.pull_started_at for r in pulls if r.pull_started_at is not None)
    image = str(pulls[0].pull_progress.get("image") or "")
    nodes = f" on {len(pulls)} nodes" if len({r.node_id for r in pulls}) > 1 else ""
    if all(_pull_end(r) is not None for r in pulls):
        seconds = max(float(r.pull_progress.get("seconds") or 0) for r in pulls)
        size = sum(int(r.pull_progress.get("bytes_total") or 0) for r in pulls)
        detail = f"pulled in {seconds:.1f} s" + (f" ({_size(size)})" if size else "") + nodes
    else:
        detail = _pull_detail(pulls) + nodes
    return LaunchStep("pulling", f"Pulling image {image}" if image else "Pulling the image", detail, began)


def _pull_end(replica: Replica) -> datetime | None:
    """When the replica's pull ended: its last report, or its start when that came first (the pull was over)."""
    return replica.pull_finished_at or replica.started_at


def _pull_detail(pulls: Sequence[Replica]) -> str:
    """Return how far the running pulls got: bytes and layers, summed over the replicas' nodes."""

    def total(name: str) -> int:
        return sum(int(r.pull_progress.get(name) or 0) for r in pulls)

    parts = []
    if total("bytes_total"):
        parts.append(f"{_size(total('bytes_done'))} of {_size(total('bytes_total'))}")
    if total("layers_total"):
        parts.append(f"{total('layers_done')} of {total('layers_total')} layers")
    return ", ".join(parts) or "asking the registry for the image"


def _size(size: int) -> str:
    """Return a byte count as people (and `docker pull`) write it: decimal kB, MB or GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def _jupyter(replicas: Sequence[Replica]) -> LaunchStep:
    first = next((r for r in replicas if r.index == 0), None)
    started = first.started_at if first is not None else None
    return LaunchStep("jupyter", "Waiting for Jupyter", "the server starts and answers its status URL", started)


def reason_label(code: str) -> str:
    """Return people's words for a reason code (`ReasonCode`'s label); an unknown code is returned as it is."""
    try:
        return str(ReasonCode(code).label)
    except ValueError:
        return code


def capacity_due(pool_id: int, *, now: datetime) -> datetime | None:
    """Return the earliest time a workload running in the pool reaches its maximum runtime, or None.

    Looks across tenants (only a time leaves this function): the scheduler
    frees those GPUs then at the latest, so it bounds when waiting work can
    start; work without a maximum runtime gives no bound.
    """
    rows = Workload.all_tenants.filter(
        pool_id=pool_id, state__in=ACTIVE_STATES, max_runtime_seconds__isnull=False, started_at__isnull=False
    ).values_list("started_at", "max_runtime_seconds")
    due = [started + timedelta(seconds=limit) for started, limit in rows if started is not None and limit is not None]
    return max(min(due), now) if due else None


def ran_on_simulated_node(workload: Workload, replicas: Sequence[Replica] = ()) -> bool:
    """Return whether any attempt of `workload` was placed on a simulated node (its output is invented).

    Reads the prefetched allocations (every attempt's) and the given replicas.
    """
    nodes = [a.node for a in workload.allocations.all()] + [r.node for r in replicas]
    return any(node.runtime == RuntimeKind.SIMULATED for node in nodes)
