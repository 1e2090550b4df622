"""Scoped reads of the jobs app.

Functions run under the active tenant scope (the default managers enforce
it) unless their docstring says they look across tenants, which only the
controller's hooks do.

One module a concern, every read re-exported here: `workloads` (workloads,
presets, allowed images), `logs`, `progress` (a launch's steps),
`notebook_access` (who may open a notebook: the proxy, the hand-off, the
pages and the API ask it), `live` (the WebSocket streams'), `telemetry`
(GPU use) and `usage` (what work holds against quotas).
"""

from jobs.selectors.live import (
    LiveRow,
    live_events_scope,
    live_log_lines,
    live_log_tail,
    live_row_of,
    live_rows_of_tenant,
    live_workload_gpus,
    live_workload_history,
    live_workload_rows,
    live_workload_state,
    watchable_workload,
)
from jobs.selectors.logs import LogLine, LogPage, iter_log_lines, log_lines_after, output_settled, workload_log
from jobs.selectors.notebook_access import (
    ProxyTarget,
    is_notebook_opener,
    may_open_notebook,
    notebook_proxy_target,
)
from jobs.selectors.progress import (
    LaunchStep,
    attempt_began,
    capacity_due,
    current_launch_steps,
    launch_steps,
    ran_on_simulated_node,
    reason_label,
    replicas_of_current_attempt,
)
from jobs.selectors.telemetry import GpuUsage, gpu_usage_by_tenant, minutes_while_held, workload_gpu_minutes
from jobs.selectors.usage import (
    QuotaUse,
    TenantAllocation,
    allocation_by_pool_and_tenant,
    project_use_in_scope,
    quota_use_in_scope,
)
from jobs.selectors.workloads import (
    active_allocations_by_node,
    allowed_images_for_operators,
    allowed_images_for_tenant,
    notebooks_awaiting_owner,
    presets_for_tenant,
    workload_detail,
    workloads_for_tenant,
    workloads_with_details,
)

__all__ = [
    "GpuUsage",
    "LaunchStep",
    "LiveRow",
    "LogLine",
    "LogPage",
    "ProxyTarget",
    "QuotaUse",
    "TenantAllocation",
    "active_allocations_by_node",
    "allocation_by_pool_and_tenant",
    "allowed_images_for_operators",
    "allowed_images_for_tenant",
    "attempt_began",
    "capacity_due",
    "current_launch_steps",
    "gpu_usage_by_tenant",
    "is_notebook_opener",
    "iter_log_lines",
    "launch_steps",
    "live_events_scope",
    "live_log_lines",
    "live_log_tail",
    "live_row_of",
    "live_rows_of_tenant",
    "live_workload_gpus",
    "live_workload_history",
    "live_workload_rows",
    "live_workload_state",
    "log_lines_after",
    "may_open_notebook",
    "minutes_while_held",
    "notebook_proxy_target",
    "notebooks_awaiting_owner",
    "output_settled",
    "presets_for_tenant",
    "project_use_in_scope",
    "quota_use_in_scope",
    "ran_on_simulated_node",
    "reason_label",
    "replicas_of_current_attempt",
    "watchable_workload",
    "workload_detail",
    "workload_gpu_minutes",
    "workload_log",
    "workloads_for_tenant",
    "workloads_with_details",
]
