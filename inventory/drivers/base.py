"""The driver contract: what a node runtime and a GPU probe promise.

Everything that crosses this boundary is a plain dataclass or a JSON-able
dict; no SDK object (docker, pynvml) ever leaves `inventory/drivers/`. A
runtime's state for one workload is an opaque JSON `Handle` that the caller
persists and hands back, so a restarted controller or agent can resume.
The handle of a workload with a service port carries `"endpoint":
"http://HOST:PORT"`, the base URL where the console reaches that port
(read it with `endpoint_of`); a runtime that runs nothing (simulated) or a
workload that has exited has none.

Errors are of two kinds: `PermanentDriverError` (retrying cannot help: bad
image, spec refused, workload unknown) and `TransientDriverError` (retry
later: engine unreachable, call timed out). Every call takes a timeout.

A workload sees volumes through its spec's `mounts`: host directories (the
`source`) below a storage root, prepared by a `storage` driver before the
runtime starts anything, and seen inside the sandbox at `target`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Handle = dict[str, Any]
"""Opaque, JSON-serializable state of one workload inside a runtime."""

DEFAULT_TIMEOUT = 30.0
"""Seconds a driver call may take unless the caller says otherwise."""

WorkloadState = Literal["created", "running", "exited", "missing"]
Stream = Literal["stdout", "stderr"]


class DriverError(Exception):
    """Base of every error a driver raises; `code` is a stable machine-readable reason."""

    code = "driver_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class PermanentDriverError(DriverError):
    """Retrying the same call cannot succeed (refused spec, unknown image, no such workload)."""

    code = "permanent"


class TransientDriverError(DriverError):
    """The call may succeed later (engine down, network blip)."""

    code = "transient"


class DriverTimeout(TransientDriverError):
    """The call did not finish within its timeout."""

    code = "timeout"


# --- runtime -------------------------------------------------------------------


@dataclass(frozen=True)
class Resources:
    """Limits of one container or process: CPU in thousandths of a core, memory and `/dev/shm` in MiB, process count.

    The names and units are the workload's own (`Workload.cpu_milli`, `memory_mib`, `shm_mib`), from the API
    to here. `shm_mib` None keeps the runtime's default (Docker's 64 MiB); the process runtime enforces none
    of these: its processes share the host's memory and `/dev/shm`.
    """

    cpu_milli: int = 1000
    memory_mib: int = 1024
    shm_mib: int | None = None
    pids: int = 1024


STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT")
"""The signals a workload may ask `stop` to send first (SIGKILL always follows after the grace period)."""


@dataclass(frozen=True)
class Mount:
    """A host directory the workload sees at `target` (absolute, inside the sandbox).

    `source` is an absolute host directory strictly below the storage root
    `root`; the storage driver creates it when missing and refuses it when it
    leads out of `root`. `marker`, when set, is what the file
    `<root>/.gpucloud-storage` must hold: it proves that the shared
    filesystem is mounted on this host, without which the volume would be
    made on the local disk underneath. `read_only` is enforced by isolating
    runtimes (docker), not by the process runtime. `uid`, `gid` and `mode`
    are what a volume directory made now gets (None: the workload's
    `run_as`, and the storage driver's default mode); one that exists keeps
    its own. `subdirs` are paths below the volume directory that the
    workload expects (its checkpoint directory): each missing component is
    made like the volume directory, with its owner and mode, so that every
    member of a shared volume may write there, whoever's workload came first.
    """

    source: str
    target: str
    read_only: bool = False
    root: str = ""
    marker: str = ""
    uid: int | None = None
    gid: int | None = None
    mode: int | None = None
    subdirs: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunAs:
    """The numeric user, group and supplementary groups a workload runs as (never root)."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()


@dataclass(frozen=True)
class WorkloadSpec:
    """What to run: one replica of one attempt of a workload.

    `name` is deterministic (derived from workload id, replica and attempt by
    the caller) so a retried `start` adopts what an earlier try created.
    `gpu_uuids` are the GPUs granted; an empty list means no GPU at all.
    `env` has already passed `policy.check_environment`.

    `service_port` is the TCP port the workload serves HTTP on inside its
    sandbox (notebooks: Jupyter's); the runtime makes it reachable from the
    console and puts the address in the handle's `endpoint`. A runtime that
    cannot give every workload its own port space (the process runtime)
    picks another port: it sets the variable named `service_port_env` (e.g.
    `JUPYTER_PORT`) to the port the workload must actually listen on, so a
    workload that serves a port should read it from there.

    `mounts` are the volumes it sees (see `Mount`; `sandbox.check_sandbox`
    holds them to its rules); `run_as` the user it runs as (None: the
    runtime's default user); `workdir` its working directory and HOME inside
    the sandbox, usually the target of its home mount ("": the image's);
    `stop_signal` what `stop` sends before SIGKILL, one of STOP_SIGNALS.

    `gang_across_hosts` marks a replica of a gang whose replicas run on
    more than one host: an isolating runtime puts it on a network of that
    gang alone that spans the hosts (docker: a swarm overlay, see
    docs/gangs.md), where the other replicas reach it by its name.

    `installation` and `node` say whose it is: the console installation
    that asked for it and the node it runs for (`policy.owner_labels`);
    a runtime records them with the workload and `list_managed` reports
    them, so a reconcile touches only its own ("": unrecorded).
    """

    name: str
    workload_id: str
    tenant: str
    attempt: int
    image: str
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    gpu_uuids: list[str] = field(default_factory=list)
    resources: Resources = field(default_factory=Resources)
    replica: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    service_port: int | None = None
    service_port_env: str = ""
    mounts: tuple[Mount, ...] = ()
    run_as: RunAs | None = None
    workdir: str = ""
    stop_signal: str = "SIGTERM"
    gang_across_hosts: bool = False
    installation: str = ""
    node: str = ""


def endpoint_url(host: str, port: int) -> str:
    """Return the endpoint `http://HOST:PORT` of `port` on `host` (an IPv6 address goes in brackets)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def endpoint_of(handle: Handle) -> str | None:
    """Return the base URL (`http://HOST:PORT`) where the console reaches the workload's service port, or None."""
    endpoint = handle.get("endpoint")
    return endpoint if isinstance(endpoint, str) and endpoint else None


@dataclass(frozen=True)
class WorkloadStatus:
    """What `poll` and `stop` observed: state, exit code once exited, and resource use."""

    state: WorkloadState
    exit_code: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    cpu_seconds: float | None = None
    memory_bytes: int | None = None
    message: str = ""
    # It ran without the runtime recording it (an engine that died in the middle of its start): its end was
    # never seen and its exit code is unknown, though its output is kept. Only with state `exited`.
    unobserved: bool = False


@dataclass(frozen=True)
class LogLine:
    """One line of output. `cursor` passed back as `since` resumes just after this line."""

    timestamp: str
    stream: Stream
    text: str
    cursor: str


@dataclass(frozen=True)
class ManagedWorkload:
    """A workload the runtime manages, as listed for reconciliation.

    `installation` and `node` are the owner recorded when it started ("" for
    one started before owners were recorded: `owner` is then LEGACY).
    """

    name: str
    workload_id: str
    tenant: str
    attempt: int
    replica: int
    state: WorkloadState
    handle: Handle
    installation: str = ""
    node: str = ""

    def owner(self, installation: str, node: str) -> Ownership:
        """Return whether this workload is that installation's node's (OWN), another's (FOREIGN) or unrecorded."""
        if not self.installation or not self.node:
            return Ownership.LEGACY
        if (self.installation, self.node) == (installation, node):
            return Ownership.OWN
        return Ownership.FOREIGN


class Ownership(enum.Enum):
    """Whose a listed workload is, as seen by one installation's node (`ManagedWorkload.owner`)."""

    OWN = "own"
    FOREIGN = "foreign"
    LEGACY = "legacy"


@dataclass(frozen=True)
class RuntimeInfo:
    """What a runtime found about its host; versions are None where absent."""

    kind: str
    isolated: bool
    simulated: bool = False
    engine_version: str | None = None
    runc_version: str | None = None
    nvidia_runtime: bool = False
    device_requests: bool = False
    toolkit_version: str | None = None
    cpu_cores: int | None = None
    memory_mib: int | None = None
    # The Docker swarm the engine is in ("" for none, or another runtime): its key (the same on every member, see
    # docker._gangs.swarm_of) and whether the engine is a manager. Gangs across hosts need one (docs/gangs.md).
    swarm: str = ""
    swarm_manager: bool = False


@dataclass(frozen=True)
class PullProgress:
    """How far the pull of an image that `start` found missing has got, as a runtime reports it.

    `layers_*` count the image's layers (`layers_total` grows as the
    manifest's layers become known; a layer already present counts as done);
    `bytes_*` add up what the layers being downloaded report (0 total when
    nothing said its size yet); `seconds` have passed since the pull began
    (a monotonic clock on the node), and `began_at` is when it began (the
    node's wall clock, seconds since the epoch), which tells one pull from a
    later retry. `done` is set on the last report of a pull that succeeded.
    """

    image: str
    began_at: float
    seconds: float = 0.0
    layers_done: int = 0
    layers_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0
    done: bool = False


PullListener = Callable[[PullProgress], None]
"""What `Runtime.start` calls while it pulls a missing image (see `start`); it must return quickly."""


@runtime_checkable
class Runtime(Protocol):
    """A node runtime: six calls, each bounded by `timeout` seconds."""

    def start(
        self, spec: WorkloadSpec, *, timeout: float = DEFAULT_TIMEOUT, on_pull: PullListener | None = None
    ) -> Handle:
        """Start `spec`, or adopt the existing workload of the same name; return its handle.

        A runtime that pulls a missing image as part of the start (docker)
        calls `on_pull` when the pull begins, about once a second while it
        runs, and once with `done` when it is over; the pull counts against
        `timeout` like the rest of the start. It never calls it for an image
        it already has, and a runtime that pulls nothing never calls it.
        What the listener raises is logged and ignored: a report that could
        not be sent does not fail a start.

        Raises PermanentDriverError when the spec or image is refused,
        TransientDriverError when the runtime cannot be reached.
        """
        ...

    def poll(self, handle: Handle, *, timeout: float = DEFAULT_TIMEOUT) -> WorkloadStatus:
        """Return the workload's current state; `missing` when it no longer exists."""
        ...

    def stop(self, handle: Handle, *, grace_seconds: float = 30.0, timeout: float = DEFAULT_TIMEOUT) -> WorkloadStatus:
        """Send the spec's stop signal (SIGTERM unless it said otherwise), kill after `grace_seconds`.

        Returns the final status. Idempotent.
        """
        ...

    def logs(
        self, handle: Handle, *, since: str | None = None, follow: bool = False, timeout: float = DEFAULT_TIMEOUT
    ) -> Iterator[LogLine]:
        """Yield output lines after cursor `since` (all when None); with `follow`, until the workload ends."""
        ...

    def list_managed(self, *, timeout: float = DEFAULT_TIMEOUT) -> list[ManagedWorkload]:
        """Return every workload this runtime manages on its host, running or exited."""
        ...

    def info(self, *, timeout: float = DEFAULT_TIMEOUT) -> RuntimeInfo:
        """Probe the runtime: engine and runc versions, GPU support, host capacity."""
        ...


@runtime_checkable
class RemovableRuntime(Protocol):
    """A runtime that can also delete a workload it created; every in-tree runtime is one."""

    def remove(self, handle: Handle, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Kill the workload if it still runs and delete it with its logs; idempotent (missing is fine)."""
        ...


# --- GPU probe -------------------------------------------------------------------


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as inventoried: index, UUID, model, memory and MIG mode."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    mig_mode: Literal["disabled", "enabled", "unsupported"] = "unsupported"


@dataclass(frozen=True)
class GpuInventory:
    """The host's GPUs and driver versions; `available` False with `reason` on a host without NVML or GPU."""

    available: bool
    gpus: list[GpuInfo] = field(default_factory=list)
    driver_version: str | None = None
    cuda_version: str | None = None
    reason: str = ""
    simulated: bool = False


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_mib: int | None


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU. Fields the hardware does not report are None.

    `xid_events` are the XID codes seen since the previous sample;
    `lost` is True when the GPU no longer answers (fell off the bus).
    """

    uuid: str
    index: int
    timestamp: float
    utilization_gpu: float | None = None
    utilization_memory: float | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: int | None = None
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    xid_events: list[int] = field(default_factory=list)
    processes: list[GpuProcess] = field(default_factory=list)
    lost: bool = False


@runtime_checkable
class GpuProbe(Protocol):
    """Reads the host's GPUs. Never raises for a host without GPUs: it reports none."""

    def inventory(self) -> GpuInventory:
        """Return the GPUs present and the driver version, or `available=False` with a reason."""
        ...

    def sample(self) -> list[GpuSample]:
        """Return one sample per GPU (empty without GPUs); cheap enough to call every second."""
        ...
