"""The driver registry: a kind names an implementation; an unknown kind is a permanent error."""

from __future__ import annotations

from pathlib import Path

import pytest

from inventory.drivers import make_probe, make_runtime
from inventory.drivers.base import GpuProbe, PermanentDriverError, RemovableRuntime, Runtime
from inventory.drivers.docker import DockerRuntime
from inventory.drivers.nvml import NvmlProbe
from inventory.drivers.process import ProcessRuntime
from inventory.drivers.simulated import SimulatedProbe, SimulatedRuntime


@pytest.mark.parametrize(
    ("kind", "implementation"),
    [("docker", DockerRuntime), ("process", ProcessRuntime), ("simulated", SimulatedRuntime)],
)
def test_make_runtime_builds_each_kind(kind: str, implementation: type, tmp_path: Path) -> None:
    runtime = make_runtime(kind, node_name="n1", work_dir=tmp_path, process_enabled=True, docker_url=None)
    assert isinstance(runtime, implementation)
    assert isinstance(runtime, Runtime) and isinstance(runtime, RemovableRuntime)


def test_the_registry_passes_its_options_on(tmp_path: Path) -> None:
    docker = make_runtime("docker", node_name="n", work_dir=tmp_path, process_enabled=False, docker_url="tcp://h:2375")
    assert isinstance(docker, DockerRuntime) and docker.base_url == "tcp://h:2375" and docker.pull_images is False
    assert docker.publish_address == "127.0.0.1"
    published = make_runtime("docker", node_name="n", work_dir=tmp_path, process_enabled=False, publish_address="::1")
    assert isinstance(published, DockerRuntime) and published.publish_address == "::1"
    process = make_runtime("process", node_name="n", work_dir=tmp_path, process_enabled=False)
    assert isinstance(process, ProcessRuntime) and process.enabled is False and process.work_dir == tmp_path
    probe = make_probe("simulated", node_name="n", gpu_count=3, model="NVIDIA L40S")
    assert [gpu.model for gpu in probe.inventory().gpus] == ["NVIDIA L40S"] * 3


@pytest.mark.parametrize(("kind", "implementation"), [("nvml", NvmlProbe), ("simulated", SimulatedProbe)])
def test_make_probe_builds_each_kind(kind: str, implementation: type) -> None:
    probe = make_probe(kind, node_name="n1")
    assert isinstance(probe, implementation) and isinstance(probe, GpuProbe)


def test_unknown_kinds_are_permanent_errors(tmp_path: Path) -> None:
    with pytest.raises(PermanentDriverError) as runtime:
        make_runtime("kubernetes", node_name="n", work_dir=tmp_path, process_enabled=False)
    assert runtime.value.code == "unknown_runtime"
    with pytest.raises(PermanentDriverError) as probe:
        make_probe("rocm", node_name="n")
    assert probe.value.code == "unknown_probe"


def test_importing_the_registry_does_not_import_the_sdks() -> None:
    import subprocess
    import sys

    code = "import sys, inventory.drivers; print('docker' in sys.modules, 'pynvml' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False"]
