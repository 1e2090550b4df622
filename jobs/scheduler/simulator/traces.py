"""Loaders for the two real traces in ../shared/data/traces/ (see their README).

Both become the same thing: a list of GPU nodes and a list of `TraceJob`s
(who submits what, when, and for how long it runs once started). A third
source, the console's own database, is read by `console.py`.

Philly-derived (Gavel's per-team streams): each file is a team, which becomes
a tenant; nodes are 8-GPU V100s; run time = total_steps / throughput, with
throughput = simulation_throughputs.json["v100"][repr((job_type, gpus))]["null"];
the job type (field 0, e.g. "Transformer (batch size 128)") is its `image`,
what the run-time predictor groups similar work by.
Rule for the ~1,550 jobs without an entry for their GPU count: the single-GPU
throughput of the same job type times the GPU count (linear scaling, an
optimistic assumption). A job of more than 8 GPUs is a gang of the fewest
equal replicas of at most 8 GPUs (16 -> 2 x 8, 12 -> 2 x 6, 20 -> 4 x 5).

Alibaba 2023 (openb): its GPU nodes, sampled evenly down to about the asked
number of GPUs; pods hashed (CRC-32 of the name) to 10 tenants; a pod asking a
fraction of a GPU counts as one whole GPU; CPU-only pods are placed by CPU
and memory; run time = deletion_time - scheduled_time.
"""

from __future__ import annotations

import csv
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

from jobs.scheduler.core import Pool

PHILLY_NODE_GPUS = 8
PHILLY_MODEL = "V100"
ALIBABA_TENANTS = 10
# The one pool of a trace that names none (both real traces).
DEFAULT_POOL = "default"


@dataclass(frozen=True, slots=True)
class TraceNode:
    """A node of the simulated cluster, in `pool`."""

    name: str
    gpus: int
    model: str
    cpu_milli: int
    memory_mib: int
    pool: str = DEFAULT_POOL


@dataclass(frozen=True, slots=True)
class TraceJob:
    """A job of a trace: `replicas` x `gpus` GPUs (a gang), submitted at `submitted_at`, running `duration_s`.

    `checkpoint_interval_s`: seconds between its checkpoints when the trace
    says (0: never); None leaves it to the simulation's settings. Neither
    real trace says. `limit_s`: the time limit it was submitted with when the
    trace records one (the console does); None: the simulation draws one
    (`users.LimitModel`). `image` is what it runs (Philly: the job type),
    `project` its project ("" for the tenant's own, named like the tenant).
    """

    id: str
    tenant: str
    submitted_at: float
    duration_s: float
    gpus: int
    replicas: int = 1
    cpu_milli: int = 0
    memory_mib: int = 0
    models: frozenset[str] = frozenset()
    checkpoint_interval_s: float | None = None
    image: str = ""
    project: str = ""
    pool: str = DEFAULT_POOL
    limit_s: float | None = None

    @property
    def project_name(self) -> str:
        """Return its project's name: its own, else its tenant's."""
        return self.project or self.tenant

    @property
    def total_gpus(self) -> int:
        """Return the GPUs the whole gang needs."""
        return self.gpus * self.replicas


@dataclass(frozen=True, slots=True)
class Trace:
    """A cluster and the jobs to replay on it; `pools` the nodes' pools when they are not all plain defaults."""

    name: str
    nodes: tuple[TraceNode, ...]
    jobs: tuple[TraceJob, ...]
    pools: tuple[Pool, ...] = ()

    def core_pools(self) -> tuple[Pool, ...]:
        """Return the pools a snapshot names: `pools`, else one default pool per pool its nodes and jobs name."""
        if self.pools:
            return self.pools
        names = {n.pool for n in self.nodes} | {j.pool for j in self.jobs}
        return tuple(Pool(name) for name in sorted(names))


def load_trace(directory: Path, gpus: int, limit_jobs: int | None = None) -> Trace:
    """Return the trace in `directory` (Philly-derived or Alibaba 2023) on about `gpus` GPUs; raises ValueError."""
    if any(directory.glob("*.trace")):
        return load_philly(directory, gpus, limit_jobs)
    if (directory / "openb_node_list_gpu_node.csv").exists():
        return load_alibaba(directory, gpus, limit_jobs)
    raise ValueError(f"{directory} holds neither *.trace files nor the openb CSV files")


def gang_shape(gpus: int, per_node: int = PHILLY_NODE_GPUS) -> tuple[int, int]:
    """Return (GPUs per replica, replicas): the fewest equal replicas of at most `per_node` GPUs."""
    replicas = next(r for r in range(1, gpus + 1) if gpus % r == 0 and gpus // r <= per_node)
    return gpus // replicas, replicas


def philly_throughput(table: dict[str, dict[str, float]], job_type: str, gpus: int) -> float:
    """Return steps per second of `job_type` on `gpus` V100s; raises KeyError for an unknown job type."""
    entry = table.get(repr((job_type, gpus)))
    if entry is not None:
        return float(entry["null"])
    return float(table[repr((job_type, 1))]["null"]) * gpus


def load_philly(directory: Path, gpus: int, limit_jobs: int | None = None) -> Trace:
    """Return the Philly-derived teams' jobs, merged by arrival, on ceil(gpus / 8) 8-GPU V100 nodes."""
    raw = json.loads((directory / "simulation_throughputs.json").read_text())["v100"]
    table = {key: {"null": value["null"]} for key, value in raw.items()}
    jobs: list[TraceJob] = []
    for path in sorted(directory.glob("*.trace")):
        for number, line in enumerate(path.read_text().splitlines()):
            fields = line.split("\t")
            job_type, total_steps, arrival, scale = fields[0], int(fields[4]), float(fields[5]), int(fields[6])
            per_replica, replicas = gang_shape(scale)
            duration = total_steps / philly_throughput(table, job_type, scale)
            job_id = f"{path.stem}-{number}"
            jobs.append(TraceJob(job_id, path.stem, arrival, duration, per_replica, replicas, image=job_type))
    jobs.sort(key=lambda j: (j.submitted_at, j.id))
    nodes = tuple(
        TraceNode(f"v100-{i:04d}", PHILLY_NODE_GPUS, PHILLY_MODEL, 64_000, 512_000)
        for i in range(-(-gpus // PHILLY_NODE_GPUS))
    )
    return Trace("philly-derived", nodes, tuple(jobs[:limit_jobs]))


def alibaba_nodes(directory: Path, gpus: int | None = None) -> tuple[TraceNode, ...]:
    """Return the openb GPU nodes, every one, or an evenly spaced sample holding about `gpus` GPUs."""
    with (directory / "openb_node_list_gpu_node.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    nodes = [TraceNode(r["sn"], int(r["gpu"]), r["model"], int(r["cpu_milli"]), int(r["memory_mib"])) for r in rows]
    total = sum(n.gpus for n in nodes)
    if gpus is None or gpus >= total:
        return tuple(nodes)
    fraction = gpus / total
    # Node i is kept when the running count of kept nodes steps up: evenly spaced, deterministic.
    return tuple(n for i, n in enumerate(nodes) if int((i + 1) * fraction) > int(i * fraction))


def alibaba_tenant(name: str) -> str:
    """Return the tenant a pod is hashed to (CRC-32 of its name, stable across runs and machines)."""
    return f"tenant-{zlib.crc32(name.encode()) % ALIBABA_TENANTS}"


def alibaba_pods(path: Path) -> list[TraceJob]:
    """Return the pods of one openb pod list; pods without times (the resampled lists) get 0 and 1 hour."""
    jobs = []
    with path.open() as handle:
        for row in csv.DictReader(handle):
            spec = row.get("gpu_spec") or ""
            created = float(row.get("creation_time") or 0)
            started = float(row.get("scheduled_time") or created)
            deleted = float(row.get("deletion_time") or started + 3600)
            jobs.append(
                TraceJob(
                    id=row["name"],
                    tenant=alibaba_tenant(row["name"]),
                    submitted_at=created,
                    duration_s=max(1.0, deleted - started),
                    gpus=int(row["num_gpu"]),
                    cpu_milli=int(row["cpu_milli"]),
                    memory_mib=int(row["memory_mib"]),
                    models=frozenset(m for m in spec.split("|") if m),
                )
            )
    return jobs


def load_alibaba(directory: Path, gpus: int, limit_jobs: int | None = None) -> Trace:
    """Return the openb default pod list, by creation time, on an even sample of its GPU nodes (~`gpus` GPUs)."""
    jobs = sorted(alibaba_pods(directory / "openb_pod_list_default.csv"), key=lambda j: (j.submitted_at, j.id))
    return Trace("alibaba-gpu-v2023", alibaba_nodes(directory, gpus), tuple(jobs[:limit_jobs]))
