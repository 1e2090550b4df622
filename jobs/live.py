"""What the jobs app publishes for the live streams: group names and `publish_*` functions.

Every publisher sends after the surrounding transaction commits (a
rolled-back change is never announced, and a reader that reacts by
querying the database finds what it was told about) and never raises
into its caller: sending goes through `common.live_layer.publish`, which
queues and returns. Groups:

- `logs.workload.<id>`: `log.lines` with each stored batch's lines, in the
  stored format `[seq, timestamp, stream, text, attempt, replica]`;
- `workload.<id>`: `workload.changed` (state) on every state change,
  `workload.allocations` when GPUs are released, `workload.deleted`;
- `events.tenant.<tenant id>`: `workload.rows` with the rows of the
  tenant's workloads that changed, one message per tenant per commit;
- `gpus.node.<name>` (the agent's sample group): `gpus.allocated` when a
  pass hands GPUs of the node to a workload, so every stream forwarding
  samples of that node re-reads which GPUs it may show.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import transaction

from common.live_layer import Outgoing, publish
from inventory.agent.reporter import node_gpu_group
from jobs.choices import TERMINAL_STATES
from jobs.models import Workload
from jobs.selectors import live_row_of, live_workload_rows

log = logging.getLogger(__name__)


def logs_group(workload_id: int) -> str:
    """Return the group that receives the workload's stored log lines."""
    return f"logs.workload.{workload_id}"


def workload_group(workload_id: int) -> str:
    """Return the group that hears of the workload's state and allocation changes."""
    return f"workload.{workload_id}"


def tenant_events_group(tenant_id: int) -> str:
    """Return the group that receives the changed workload rows of one tenant."""
    return f"events.tenant.{tenant_id}"


def state_message(state: str) -> dict[str, Any]:
    """Return the `workload.changed` message for a workload now in `state`."""
    return {"type": "workload.changed", "state": state, "ended": state in TERMINAL_STATES}


def publish_log_lines(workload_id: int, lines: list[list[Any]]) -> None:
    """After commit, send one stored batch of lines to the workload's log group."""
    messages: list[Outgoing] = [(logs_group(workload_id), {"type": "log.lines", "lines": lines})]
    transaction.on_commit(lambda: publish(messages))


def publish_workload_changes(workload_ids: Iterable[int], *, state_changed: Iterable[int] = ()) -> None:
    """After commit, send the rows of these workloads to their tenants' event groups, one message per tenant,
    and a `workload.changed` message to the group of each workload in `state_changed`.

    The rows are read once, after the commit, so they carry the committed values.
    """
    ids = sorted({int(pk) for pk in workload_ids})
    moved = {int(pk) for pk in state_changed}
    if ids:
        transaction.on_commit(lambda: _send_changes(ids, moved))


def publish_new_workloads(workloads: Sequence[Workload]) -> None:
    """After commit, send the rows of workloads this transaction created to their tenants' event groups.

    Built from the instances instead of read back: a submission commits its
    rows exactly as written, and at hundreds of submissions a second the
    read-back was a query per commit.
    """
    messages = _rows_by_tenant((w.tenant_id, live_row_of(w)) for w in workloads)
    if messages:
        transaction.on_commit(lambda: publish(messages))


def publish_allocations_changed(workload_id: int) -> None:
    """After commit, tell the workload's streams that its allocations changed."""
    messages: list[Outgoing] = [(workload_group(workload_id), {"type": "workload.allocations"})]
    transaction.on_commit(lambda: publish(messages))


def publish_gpus_allocated(node_names: Iterable[str]) -> None:
    """After commit, tell the streams watching these nodes that some of their GPUs changed hands."""
    messages: list[Outgoing] = [(node_gpu_group(name), {"type": "gpus.allocated"}) for name in sorted(set(node_names))]
    if messages:
        transaction.on_commit(lambda: publish(messages))


def publish_workload_deleted(workload_id: int) -> None:
    """After commit, tell the workload's streams that it no longer exists."""
    messages: list[Outgoing] = [(workload_group(workload_id), {"type": "workload.deleted"})]
    transaction.on_commit(lambda: publish(messages))


def _send_changes(ids: list[int], moved: set[int]) -> None:
    # Runs after the commit, outside the caller's transaction: a failure here must not surface there.
    try:
        rows = live_workload_rows(ids)
    except Exception:
        log.exception("live workload rows could not be read")
        return
    messages: list[Outgoing] = [
        (workload_group(row["id"]), state_message(row["state"])) for _, row in rows if row["id"] in moved
    ]
    publish(messages + _rows_by_tenant(rows))


def _rows_by_tenant(rows: Iterable[tuple[int, dict[str, Any]]]) -> list[Outgoing]:
    """Return one `workload.rows` message per tenant, to its event group, with that tenant's rows in order."""
    by_tenant: dict[int, list[dict[str, Any]]] = {}
    for tenant_id, row in rows:
        by_tenant.setdefault(tenant_id, []).append(row)
    return [(tenant_events_group(t), {"type": "workload.rows", "rows": r}) for t, r in by_tenant.items()]
