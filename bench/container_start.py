"""Start and stop latency of a container through DockerRuntime versus the docker CLI doing the same.

    .venv/bin/python bench/container_start.py [--iterations 20] [--grace 10] [--image gpucloud-test/busybox:latest]

Each iteration starts `sleep 3600` and stops it with the same grace period,
three ways, interleaved so that engine noise hits all of them alike:

- `runtime`: DockerRuntime.start (adoption check, tenant network, create,
  start) then DockerRuntime.stop (SIGTERM, then SIGKILL after the grace);
- `cli`: `docker run -d` with the flags that give the same container
  (hardening, limits, tenant network, labels), then `docker stop -t`;
- `cli_plain`: `docker run -d --init IMAGE sleep 3600`, then `docker stop -t`,
  to show what the hardening itself costs.

Every container runs tini (`--init`), so `sleep` ends on SIGTERM and stop
measures the stop path, not the grace period. Start is timed until the call
returns with the container started; that it runs is checked untimed. The
ratio is runtime / cli at p50 and p95. Uses a local image only (built by
.ci/build-test-image when missing); everything created is removed.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from inventory.drivers import policy  # noqa: E402 -- after the path is set
from inventory.drivers.base import Resources, WorkloadSpec  # noqa: E402
from inventory.drivers.docker import DockerRuntime, container_config  # noqa: E402

COMMAND = ["sleep", "3600"]
TENANT = f"bench-{uuid.uuid4().hex[:6]}"
INSTALLATION = uuid.uuid4().hex[:16]  # a console of its own: its names and bridge never meet a real console's


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True).stdout.strip()


def _spec(image: str, iteration: int, way: str) -> WorkloadSpec:
    workload = f"bench{way}{uuid.uuid4().hex[:8]}"
    return WorkloadSpec(
        name=policy.container_name(INSTALLATION, workload, 0, iteration),
        installation=INSTALLATION,
        workload_id=workload,
        tenant=TENANT,
        attempt=iteration,
        image=image,
        command=COMMAND,
        resources=Resources(cpu_milli=1000, memory_mib=256, pids=128),
    )


def _cli_flags(spec: WorkloadSpec, runtime: DockerRuntime) -> list[str]:
    """Return the `docker run` flags that create what `container_config` describes."""
    config = container_config(spec, user=runtime.user, network=policy.tenant_network_name(INSTALLATION, spec.tenant))
    host = config["host_config"]
    flags = ["--init", "--user", config["user"], "--network", host["NetworkMode"], "--cap-drop", "ALL"]
    flags += ["--security-opt", "no-new-privileges", "--ipc", "private", "--pids-limit", str(host["PidsLimit"])]
    flags += ["--memory", str(host["Memory"]), "--memory-swap", str(host["MemorySwap"])]
    flags += ["--cpus", str(host["NanoCpus"] / 1e9), "--log-driver", "json-file"]
    flags += [f"--log-opt={key}={value}" for key, value in host["LogConfig"]["Config"].items()]
    flags += [f"--env={key}={value}" for key, value in config["environment"].items()]
    flags += [f"--label={key}={value}" for key, value in config["labels"].items()]
    return [*flags, "--name", spec.name]


def _timed(action: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(fraction * len(ordered)) - 1, 0)]


def _summary(starts: list[float], stops: list[float]) -> dict[str, float]:
    return {
        "start_p50_ms": round(_percentile(starts, 0.5) * 1000, 1),
        "start_p95_ms": round(_percentile(starts, 0.95) * 1000, 1),
        "stop_p50_ms": round(_percentile(stops, 0.5) * 1000, 1),
        "stop_p95_ms": round(_percentile(stops, 0.95) * 1000, 1),
    }


def _through_runtime(runtime: DockerRuntime, spec: WorkloadSpec, grace: int) -> tuple[float, float]:
    start, handle = _timed(lambda: runtime.start(spec))
    assert isinstance(handle, dict)
    if runtime.poll(handle).state != "running":
        raise SystemExit(f"{spec.name} is not running after start")
    stop, _ = _timed(lambda: runtime.stop(handle, grace_seconds=grace))
    runtime.remove(handle)
    return start, stop


def _through_cli(flags: list[str], image: str, grace: int) -> tuple[float, float]:
    start, container = _timed(lambda: _docker("run", "-d", *flags, image, *COMMAND))
    assert isinstance(container, str)
    if _docker("inspect", "-f", "{{.State.Running}}", container) != "true":
        raise SystemExit(f"{container} is not running after docker run")
    stop, _ = _timed(lambda: _docker("stop", "-t", str(grace), container))
    _docker("rm", "-f", container)
    return start, stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--grace", type=int, default=10, help="stop timeout in seconds, the same for every way")
    parser.add_argument("--image", default="gpucloud-test/busybox:latest")
    args = parser.parse_args()
    subprocess.run([str(ROOT / ".ci" / "build-test-image"), args.image], check=True)
    runtime = DockerRuntime()
    times: dict[str, tuple[list[float], list[float]]] = {way: ([], []) for way in ("runtime", "cli", "cli_plain")}
    try:
        runtime.start(_spec(args.image, 0, "warm"))  # creates the tenant network outside the measurement
        for iteration in range(1, args.iterations + 1):
            results = {
                "runtime": _through_runtime(runtime, _spec(args.image, iteration, "r"), args.grace),
                "cli": _through_cli(_cli_flags(_spec(args.image, iteration, "c"), runtime), args.image, args.grace),
                "cli_plain": _through_cli(["--init"], args.image, args.grace),
            }
            for way, (start, stop) in results.items():
                times[way][0].append(start)
                times[way][1].append(stop)
    finally:
        leftovers = _docker("ps", "-aq", "--filter", f"label={policy.LABEL_TENANT}={TENANT}").split()
        if leftovers:
            _docker("rm", "-f", *leftovers)
        _docker("network", "rm", policy.tenant_network_name(INSTALLATION, TENANT))
    summary = {way: _summary(*measured) for way, measured in times.items()}
    ratio = {key.removesuffix("_ms"): round(summary["runtime"][key] / summary["cli"][key], 2) for key in summary["cli"]}
    print(json.dumps({"iterations": args.iterations, "grace_seconds": args.grace, **summary, "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
