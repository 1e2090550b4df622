"""All writes of the jobs app: submission, cancellation and compare-and-swap state changes.

Every function is typed and keyword-only, runs in one transaction and says
in its docstring what it returns and raises. The scheduling shell
(`jobs.scheduler.shell`) commits its own placements in bulk.
"""

from jobs.services.lifecycle import CANCELLABLE_STATES, cancel_workload, release_allocations, transition_workload
from jobs.services.spec import WorkloadSpec
from jobs.services.submission import Submission, submit, submit_workload, submit_workloads

__all__ = [
    "CANCELLABLE_STATES",
    "Submission",
    "WorkloadSpec",
    "cancel_workload",
    "release_allocations",
    "submit",
    "submit_workload",
    "submit_workloads",
    "transition_workload",
]
