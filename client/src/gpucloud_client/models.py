"""Typed views of the API's objects.

Every model is built with `from_json`, which ignores keys it does not know (a newer console may add fields)
and fills a missing one with its default, and keeps the object exactly as the API sent it in `raw`, which is
what `gpc -o json|yaml` prints.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

T = TypeVar("T", bound="ApiObject")

TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "lost"})
# Where `wait` stops: the terminal states, and hibernated, where a notebook rests until resumed.
RESTING_STATES = TERMINAL_STATES | {"hibernated"}
ACTIVE_STATES = frozenset({"pending", "scheduled", "starting", "running", "preempted"})


@dataclass
class ApiObject:
    """Base of the models: `from_json` and the untouched `raw` object."""

    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False, kw_only=True)
    # Fields holding nested models: name -> model class (the value is a list of them, or one, or null).
    _nested: ClassVar[dict[str, type[ApiObject]]] = {}

    @classmethod
    def from_json(cls: type[T], data: dict[str, Any]) -> T:
        """Return the model of API object `data`; unknown keys are ignored, missing ones take defaults."""
        known = {f.name for f in dataclasses.fields(cls) if f.init and f.name != "raw"}
        values: dict[str, Any] = {}
        for key in known & data.keys():
            value = data[key]
            nested = cls._nested.get(key)
            if nested is not None and isinstance(value, list):
                value = [nested.from_json(item) for item in value if isinstance(item, dict)]
            elif nested is not None and isinstance(value, dict):
                value = nested.from_json(value)
            values[key] = value
        return cls(**values, raw=data)


@dataclass
class TokenInfo(ApiObject):
    """The API token a request was made with (`tenant` is None for an operator token)."""

    id: int | None = None
    prefix: str = ""
    name: str = ""
    role: str = ""
    tenant: str | None = None
    expires_at: str | None = None


@dataclass
class Membership(ApiObject):
    """A tenant the caller belongs to, with the role there."""

    tenant: str = ""
    tenant_name: str = ""
    role: str = ""


@dataclass
class Me(ApiObject):
    """The caller (`GET me/`)."""

    username: str = ""
    email: str = ""
    is_operator: bool = False
    token: TokenInfo | None = None
    memberships: list[Membership] = field(default_factory=list)
    _nested: ClassVar[dict[str, type[ApiObject]]] = {"token": TokenInfo, "memberships": Membership}


@dataclass
class Workload(ApiObject):
    """A batch job or notebook session, as the workload list and every action answer it."""

    id: int = 0
    name: str = ""
    kind: str = ""
    state: str = ""
    project: str = ""
    pool: str | None = None
    owner: str = ""
    image: str = ""
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    gpus_per_replica: int = 0
    replicas: int = 1
    gpu_models: list[str] = field(default_factory=list)
    cpu_milli: int = 0
    memory_mib: int = 0
    shm_mib: int | None = None
    priority_class: str = ""
    max_runtime_seconds: int | None = None
    requeue_limit: int = 0
    stop_signal: str | None = None
    attempt: int = 0
    reason_code: str = ""
    reason_message: str = ""
    reason_hint: str = ""
    queue_position: int | None = None
    exit_code: int | None = None
    submitted_at: str | None = None
    scheduled_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    checkpointed_at: str | None = None
    lost_gpu_seconds: float | None = None
    preemptions: int = 0
    predicted_runtime_seconds: int | None = None
    prediction_basis: str = ""
    run_seconds: float | None = None
    prediction_error: float | None = None
    estimated_start_at: str | None = None
    estimate_basis: str = ""
    reservation: dict[str, Any] | None = None

    @property
    def ended(self) -> bool:
        """Return whether the workload is in a terminal state (succeeded, failed, cancelled, lost)."""
        return self.state in TERMINAL_STATES

    @property
    def resting(self) -> bool:
        """Return whether `wait` stops here: a terminal state or hibernated."""
        return self.state in RESTING_STATES

    @property
    def gpus(self) -> int:
        """Return the GPUs the whole gang asks for."""
        return self.gpus_per_replica * self.replicas


@dataclass
class Allocation(ApiObject):
    """A GPU (or, for a CPU-only workload, a node) one replica holds or held."""

    replica: int = 0
    node: str = ""
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    gpu_model: str | None = None
    created_at: str | None = None
    released_at: str | None = None


@dataclass
class WorkloadEvent(ApiObject):
    """One entry of a workload's timeline."""

    kind: str = ""
    from_state: str = ""
    to_state: str = ""
    reason_code: str = ""
    message: str = ""
    created_at: str | None = None


@dataclass
class LaunchStep(ApiObject):
    """One step of getting a workload running; `status` is "done", "current" or "next"."""

    key: str = ""
    label: str = ""
    detail: str = ""
    status: str = ""
    at: str | None = None


@dataclass
class WorkloadDetail(Workload):
    """A workload with where it runs, what happened to it, and (notebooks) how to open it.

    `notebook_url` is a path on the console (join it with the context's URL), None until the notebook
    answers or when the caller may not open it. `actions` names what the caller may do to it now (`cancel`,
    `hibernate`, `resume`, `restart`, `extend`, `open`), as the console decides it.
    """

    allocations: list[Allocation] = field(default_factory=list)
    events: list[WorkloadEvent] = field(default_factory=list)
    launch_steps: list[LaunchStep] = field(default_factory=list)
    notebook_url: str | None = None
    lab_path: str | None = None
    actions: list[str] = field(default_factory=list)
    _nested: ClassVar[dict[str, type[ApiObject]]] = {
        "allocations": Allocation,
        "events": WorkloadEvent,
        "launch_steps": LaunchStep,
    }


@dataclass
class LogLine(ApiObject):
    """One stored log line; `seq` numbers a workload's lines, increasing, across attempts."""

    seq: int = 0
    timestamp: str = ""
    stream: str = "stdout"
    text: str = ""
    attempt: int = 0
    replica: int = 0

    @classmethod
    def from_row(cls, row: list[Any]) -> LogLine:
        """Return the line of the WebSocket's compact form `[seq, ts, stream, text, attempt, replica]`."""
        seq, timestamp, stream, text, attempt, replica = row[:6]
        data = {"seq": seq, "timestamp": timestamp, "stream": stream, "text": text, "attempt": attempt}
        data["replica"] = replica
        return cls(seq=seq, timestamp=timestamp, stream=stream, text=text, attempt=attempt, replica=replica, raw=data)


@dataclass
class LogPage(ApiObject):
    """A page of a log: poll with `since=next_since` until `complete`."""

    lines: list[LogLine] = field(default_factory=list)
    next_since: int = 0
    complete: bool = False
    _nested: ClassVar[dict[str, type[ApiObject]]] = {"lines": LogLine}


@dataclass
class QuotaUse(ApiObject):
    """GPUs in use against one quota; `project` None is the tenant's own quota, `limit` None is none."""

    project: str | None = None
    pool: str = ""
    guaranteed: int = 0
    limit: int | None = None
    in_use: int = 0
    borrowed: int = 0
    running: int = 0
    pending: int = 0


@dataclass
class Quota(ApiObject):
    """What may be used in one pool: the tenant's quota (`project` None) or a project's inside it."""

    id: int = 0
    pool: str = ""
    tenant: str | None = None
    project: str | None = None
    guaranteed: int = 0
    limit: int | None = None
    weight: int | None = None
    max_notebooks_per_user: int | None = None
    max_pending_workloads: int | None = None
    max_runtime_seconds: int | None = None
    updated_at: str | None = None


@dataclass
class Volume(ApiObject):
    """A storage volume the caller can see (home, project volume or dataset)."""

    id: int = 0
    kind: str = ""
    name: str = ""
    description: str = ""
    backend: str | None = None
    project: str | None = None
    owner: str | None = None
    mount_path: str | None = None
    size_limit_bytes: int | None = None
    used_bytes: int | None = None
    used_measured_at: str | None = None
    can_read: bool = False
    can_write: bool = False
    created_at: str | None = None


@dataclass
class WorkloadRow(ApiObject):
    """A row of the events stream; `snapshot` marks the rows of the first message of a connection."""

    id: int = 0
    project: str = ""
    name: str = ""
    kind: str = ""
    state: str = ""
    reason_code: str = ""
    reason: str = ""
    queue_position: int | None = None
    updated_at: str | None = None
    snapshot: bool = False


@dataclass
class GpuSample(ApiObject):
    """One GPU's newest sample (None where the GPU reports nothing)."""

    uuid: str = ""
    index: int = 0
    utilization_gpu: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None


@dataclass
class GpuBatch(ApiObject):
    """The samples of a workload's GPUs on one node at `at` (epoch seconds)."""

    node: str = ""
    at: float = 0.0
    gpus: list[GpuSample] = field(default_factory=list)
    _nested: ClassVar[dict[str, type[ApiObject]]] = {"gpus": GpuSample}
