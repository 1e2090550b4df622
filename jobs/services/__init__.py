"""All writes of the jobs app: submission, execution (launch, reports, stop, restart), compare-and-swap state changes.

Every function is typed and keyword-only, runs in one transaction and says
in its docstring what it returns and raises. The scheduling shell
(`jobs.scheduler.shell`) commits its own placements in bulk.
"""

from jobs.services.actions import CANCELLABLE_STATES, cancel_workload, restart_workload
from jobs.services.hibernation import hibernate_notebook, resume_notebook
from jobs.services.idle import check_idle_notebooks, extend_notebook
from jobs.services.lifecycle import release_allocations, transition_workload
from jobs.services.logs import ingest_log_batch, purge_expired_logs
from jobs.services.spec import WorkloadSpec
from jobs.services.stopping import stop_workload
from jobs.services.submission import (
    Submission,
    SubmissionRequest,
    submit,
    submit_batch,
    submit_workload,
    submit_workloads,
)

__all__ = [
    "CANCELLABLE_STATES",
    "Submission",
    "SubmissionRequest",
    "WorkloadSpec",
    "cancel_workload",
    "check_idle_notebooks",
    "extend_notebook",
    "hibernate_notebook",
    "ingest_log_batch",
    "purge_expired_logs",
    "release_allocations",
    "restart_workload",
    "resume_notebook",
    "stop_workload",
    "submit",
    "submit_batch",
    "submit_workload",
    "submit_workloads",
    "transition_workload",
]
