"""Every message between the controller and the node agents, with its task name and version.

Commands go from the controller to a node's queue (`node.<name>`; the HTTPS
gateway hands them to joined hosts); reports go from an agent to the
controller (over Celery from a co-located agent, through the gateway from a
joined host). A message's fields are its Celery task's keyword arguments.

The shape of every message is pinned per version in `schema.json`
(`tests/common/protocol/test_schema.py`): a change of fields or types
comes with a higher VERSION (see docs/nodes.md, "The agent protocol").
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from common.protocol.wire import Message, Record, bounded, record

Runtime = Literal["docker", "process", "simulated"]
StopSignal = Literal["SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT"]

# Bounds shared by many fields: what no legitimate sender exceeds.
NAME = 253  # a replica or node name (a DNS name at most)
REPLICAS = 4095  # the highest replica index of one workload
TEXT = 65_536  # a human message (an error, a runtime's note), a log line
PATH = 4096


# --- commands: controller -> agent --------------------------------------------------------------------------


@record
class ProbeNode(Message):
    """Probe the node for provisioning (`probe_request` of `inventory.services.provisioning`); it returns its report."""

    TASK: ClassVar[str] = "agent.probe_node"
    VERSION: ClassVar[int] = 1

    request: dict[str, Any]


@record
class MountSpec(Record):
    """A volume of a start: the driver's `Mount` (host `source` below storage `root`, seen at `target`)."""

    source: str = bounded(max_len=PATH)
    target: str = bounded(max_len=PATH)
    read_only: bool = False
    root: str = bounded(default="", max_len=PATH)
    marker: str = ""
    uid: int | None = bounded(default=None, hi=2**32 - 1)
    gid: int | None = bounded(default=None, hi=2**32 - 1)
    mode: int | None = bounded(default=None, hi=0o7777)
    subdirs: list[str] = bounded(default=[], max_len=64)


@record
class RunAsSpec(Record):
    """The user a replica runs as: the driver's `RunAs`."""

    uid: int = bounded(hi=2**32 - 1)
    gid: int = bounded(hi=2**32 - 1)
    groups: list[int] = bounded(default=[], max_len=1024)


# The resource limits of a replica, named alike wherever a workload is held: `jobs.models.Workload` and
# `LaunchPreset`, `jobs.services.spec.WorkloadSpec` and `presets.PresetValues`, `ReplicaSpec` and the driver's
# `Resources`; each step from the API to the driver copies them by these names. A new limit is a field of each,
# named here (tests/inventory/test_protocol_parity.py and tests/jobs/test_resource_fields.py hold them to it).
RESOURCE_FIELDS = ("cpu_milli", "memory_mib", "shm_mib")


@record
class ReplicaSpec(Record):
    """One replica to start: the driver's `WorkloadSpec` plus where reports go and how readiness is checked.

    `ready_path` and `secret`: a notebook's status URL and token, polled until
    Jupyter answers; `checkpoint_dir`: the node's path of a job's checkpoint
    directory, watched while it runs.
    """

    node: str = bounded(max_len=NAME)
    runtime: Runtime
    name: str = bounded(max_len=NAME)
    workload_id: int
    tenant: str = bounded(max_len=NAME)
    attempt: int
    replica: int = bounded(hi=REPLICAS)
    image: str = bounded(max_len=1024)
    installation: str = bounded(default="", max_len=NAME)
    command: list[str] = bounded(default=[], max_len=4096)
    env: dict[str, str] = bounded(default={}, max_len=4096)
    gpu_uuids: list[str] = bounded(default=[], max_len=64)
    cpu_milli: int = bounded(default=1000, lo=1, hi=2**31 - 1)
    memory_mib: int = bounded(default=1024, lo=1, hi=2**40)
    shm_mib: int | None = bounded(default=None, lo=1, hi=2**40)
    service_port: int | None = bounded(default=None, lo=1, hi=65535)
    service_port_env: str = bounded(default="", max_len=NAME)
    ready_path: str = bounded(default="", max_len=PATH)
    secret: str = bounded(default="", max_len=NAME)
    mounts: list[MountSpec] = bounded(default=[], max_len=64)
    run_as: RunAsSpec | None = None
    workdir: str = bounded(default="", max_len=PATH)
    stop_signal: StopSignal = "SIGTERM"
    gang_across_hosts: bool = False
    checkpoint_dir: str = bounded(default="", max_len=PATH)


@record
class StartReplica(Message):
    """Start (or adopt) one replica and watch it; the agent reports `ReplicaStarted` or `ReplicaExited`.

    Version 2: the spec's CPU and memory are `cpu_milli` and `memory_mib`, the workload's own names and units
    (version 1 had `cpus`, a float of cores, and `memory_mb`). Version 3: `shm_mib`, the size of `/dev/shm`
    (None: the runtime's default).
    """

    TASK: ClassVar[str] = "agent.start_replica"
    VERSION: ClassVar[int] = 3

    spec: ReplicaSpec


@record
class StopReplica(Message):
    """Stop one replica (its stop signal, `grace_seconds`, SIGKILL), remove it if asked, report its exit.

    `ended`: the ledger holds its exit already, so no report is sent. Without
    a `handle`, the agent finds the replica by name among `installation`'s.
    """

    TASK: ClassVar[str] = "agent.stop_replica"
    VERSION: ClassVar[int] = 1

    node: str = bounded(max_len=NAME)
    runtime: Runtime
    name: str = bounded(max_len=NAME)
    workload_id: int
    attempt: int
    replica: int = bounded(hi=REPLICAS)
    handle: dict[str, Any] = bounded(default={}, max_len=64)
    installation: str = bounded(default="", max_len=NAME)
    grace_seconds: float = bounded(default=30.0, lo=0, hi=86_400)
    remove: bool = False
    ended: bool = False


@record
class WatchReplica(Message):
    """Follow a replica the controller believes runs, resuming its output at `log_cursor`.

    `report_start`: report it started if a watcher already follows it;
    `resend`: read its output again from `log_cursor` (a batch was lost).
    """

    TASK: ClassVar[str] = "agent.watch_replica"
    VERSION: ClassVar[int] = 1

    node: str = bounded(max_len=NAME)
    runtime: Runtime
    name: str = bounded(max_len=NAME)
    workload_id: int
    attempt: int
    replica: int = bounded(hi=REPLICAS)
    handle: dict[str, Any] = bounded(default={}, max_len=64)
    log_cursor: str = bounded(default="", max_len=NAME)
    report_start: bool = True
    resend: bool = False
    ready_path: str = bounded(default="", max_len=PATH)
    secret: str = bounded(default="", max_len=NAME)
    checkpoint_dir: str = bounded(default="", max_len=PATH)


@record
class ListReplicas(Message):
    """Report the node's own view of its replicas (`NodeReplicas`) for reconcile.

    `confirmed`: replicas whose start the ledger heard of (only those can be
    gone); `launched`: those whose start was sent (None: not named).
    """

    TASK: ClassVar[str] = "agent.list_replicas"
    VERSION: ClassVar[int] = 1

    node: str = bounded(max_len=NAME)
    runtime: Runtime
    confirmed: list[str] | None = None
    launched: list[str] | None = None
    installation: str = bounded(default="", max_len=NAME)


# --- reports: agent -> controller ---------------------------------------------------------------------------


@record
class ReplicaStarted(Message):
    """An agent started (or adopted) a replica; `endpoint` is where the console reaches its service port."""

    TASK: ClassVar[str] = "jobs.replica_started"
    VERSION: ClassVar[int] = 1

    workload_id: int
    attempt: int
    replica: int = bounded(hi=REPLICAS)
    handle: dict[str, Any] = bounded(max_len=64)
    endpoint: str = bounded(default="", max_len=NAME + 16)


@record
class ReplicaPulling(Message):
    """How far the image pull of a replica's start has got: the driver's `PullProgress`."""

    TASK: ClassVar[str] = "jobs.replica_pulling"
    VERSION: ClassVar[int] = 1

    workload_id: int
    attempt: int
    replica: int = bounded(hi=REPLICAS)
    image: str = bounded(max_len=1024)
    began_at: float = bounded(lo=0, hi=2**40)
    seconds: float = bounded(default=0.0, lo=0, hi=2**40)
    layers_done: int = bounded(default=0, hi=100_000)
    layers_total: int = bounded(default=0, hi=100_000)
    bytes_done: int = 0
    bytes_total: int = 0
    done: bool = False


@record
class ReplicaReady(Message):
    """A notebook's Jupyter server answered its status URL."""

    TASK: ClassVar[str] = "jobs.replica_ready"
    VERSION: ClassVar[int] = 1

    workload_id: int
    attempt: int
    replica: int = bounded(hi=REPLICAS)


@record
class ReplicaExited(Message):
    """A replica ended, was stopped, or could not be launched.

    `log_cursor`: where its shipped output ends; `unobserved`: the engine lost
    track of its run, so how it ended is not known.
    """

    TASK: ClassVar[str] = "jobs.replica_exited"
    VERSION: ClassVar[int] = 1

    workload_id: int
    attempt: int
    replica: int = bounded(hi=REPLICAS)
    exit_code: int | None = bounded(lo=-(2**31), hi=2**31 - 1)
    message: str = bounded(default="", max_len=TEXT)
    launch_failed: bool = False
    log_cursor: str | None = bounded(default=None, max_len=NAME)
    unobserved: bool = False


@record
class ReplicaCheckpointed(Message):
    """A job wrote to its checkpoint directory; `at` is the newest file's time (epoch seconds) on its node."""

    TASK: ClassVar[str] = "jobs.replica_checkpointed"
    VERSION: ClassVar[int] = 1

    workload_id: int
    attempt: int
    replica: int = bounded(hi=REPLICAS)
    at: float = bounded(lo=0, hi=2**40)


@record
class LogBatch(Record):
    """A chained batch of one replica's output: lines `[timestamp, stream, text]` after `since`, up to `cursor`.

    `marks`: each line's own cursor; `retries`: how often the controller put it back (its own counter).
    """

    workload_id: int
    attempt: int
    replica: int = bounded(hi=REPLICAS)
    since: str = bounded(max_len=NAME)
    cursor: str = bounded(max_len=NAME)
    lines: list[list[str]] = bounded(max_len=10_000)
    marks: list[str] = bounded(default=[], max_len=10_000)
    retries: int = bounded(default=0, hi=100)


@record
class LogBatches(Message):
    """A node's log batches, stored in order."""

    TASK: ClassVar[str] = "jobs.ingest_log_batches"
    VERSION: ClassVar[int] = 1

    batches: list[LogBatch] = bounded(max_len=1000)


@record
class ManagedReplica(Record):
    """One replica the node's runtime has (the driver's `ManagedWorkload`), as a node reports it."""

    name: str = bounded(max_len=NAME)
    workload_id: str = bounded(max_len=32)
    attempt: int
    replica: int = bounded(hi=REPLICAS)
    state: Literal["created", "running", "exited", "missing"]
    handle: dict[str, Any] = bounded(max_len=64)
    installation: str = bounded(default="", max_len=NAME)
    node: str = bounded(default="", max_len=NAME)


@record
class NodeReplicas(Message):
    """A node's own view of its replicas, answering `ListReplicas`: compared with the ledger by reconcile."""

    TASK: ClassVar[str] = "jobs.node_replicas"
    VERSION: ClassVar[int] = 1

    node: str = bounded(max_len=NAME)
    managed: list[ManagedReplica] = bounded(max_len=10_000)
    starting: list[str] | None = None
    gone: list[str] | None = None
    unstarted: list[str] | None = None


@record
class Reconcile(Message):
    """Ask the controller for a reconcile now (an agent's runtime answers again after an outage)."""

    TASK: ClassVar[str] = "jobs.reconcile"
    VERSION: ClassVar[int] = 1


# --- telemetry: agent -> controller, not Celery tasks ----------------------------------------------------


@record
class GpuProcessReading(Record):
    """A process on a GPU: the driver's `GpuProcess`."""

    pid: int = bounded(hi=2**31 - 1)
    used_memory_mib: int | None


@record
class GpuReading(Record):
    """One reading of one GPU: the driver's `GpuSample` (fields the hardware does not report are null)."""

    uuid: str = bounded(max_len=NAME)
    index: int = bounded(hi=1023)
    timestamp: float = bounded(lo=0, hi=2**40)
    utilization_gpu: float | None = None
    utilization_memory: float | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: int | None = None
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    xid_events: list[int] = bounded(default=[], max_len=1000)
    processes: list[GpuProcessReading] = bounded(default=[], max_len=4096)
    lost: bool = False


@record
class Heartbeat(Message):
    """An agent's heartbeat, posted to the controller's mailbox (`inventory.mailbox`), not run as a task.

    `samples`: the latest reading of each GPU; `history`: every reading since the last report that got
    through, per GPU UUID, as `[timestamp, utilization_gpu, memory_used_mib, power_w, temperature_c]`.

    Version 2: a reading's memory is `memory_used_mib` and `memory_total_mib`, and a process's
    `used_memory_mib`, the names of the unit they always were in (version 1 had `memory_used_mb`,
    `memory_total_mb` and `used_memory_mb`).
    """

    TASK: ClassVar[str] = "heartbeat"
    VERSION: ClassVar[int] = 2

    node: str = bounded(default="", max_len=NAME)
    agent_version: str = bounded(default="", max_len=NAME)
    sent_at: float = bounded(default=0.0, lo=0, hi=2**40)
    samples: list[GpuReading] = bounded(default=[], max_len=1024)
    history: dict[str, list[list[float | None]]] = bounded(default={}, max_len=1024)


@record
class LiveSamples(Message):
    """The latest GPU readings of a node, for its live views (the channel layer), not run as a task.

    Version 2: the readings' memory fields are in MiB by name, as `Heartbeat`'s version 2 says.
    """

    TASK: ClassVar[str] = "samples"
    VERSION: ClassVar[int] = 2

    samples: list[GpuReading] = bounded(max_len=1024)


COMMANDS: tuple[type[Message], ...] = (ProbeNode, StartReplica, StopReplica, WatchReplica, ListReplicas)
REPORTS: tuple[type[Message], ...] = (
    ReplicaStarted,
    ReplicaPulling,
    ReplicaReady,
    ReplicaExited,
    ReplicaCheckpointed,
    LogBatches,
    NodeReplicas,
    Reconcile,
)
BY_TASK: dict[str, type[Message]] = {message.TASK: message for message in COMMANDS + REPORTS}
TELEMETRY: tuple[type[Message], ...] = (Heartbeat, LiveSamples)
"""Messages that are not Celery tasks; their TASK is the gateway's message kind."""
ALL: dict[str, type[Message]] = {**BY_TASK, **{message.TASK: message for message in TELEMETRY}}
"""Every message by name, as `schema.json` pins them."""
