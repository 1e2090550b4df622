"""The process runtime runs real process groups: environment, logs, stop, adoption, restart, refusal."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from inventory.drivers import policy, run_health_check
from inventory.drivers.base import DriverTimeout, PermanentDriverError, Runtime, WorkloadSpec
from inventory.drivers.policy import SpecRefused
from inventory.drivers.process import ProcessRuntime
from tests.inventory.drivers.conftest import TEST_INSTALLATION, new_spec, wait_for
from tests.process_user import workload_python

TRAPS_TERM = "trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 0.05; done"
IGNORES_TERM = "trap '' TERM; echo ready; while :; do sleep 0.05; done"


@pytest.fixture
def runtime(workload_tmp: Path) -> Iterator[ProcessRuntime]:
    runtime = ProcessRuntime(workload_tmp / "work", enabled=True)
    yield runtime
    for workload in runtime.list_managed():
        runtime.remove(workload.handle, timeout=5)


def spec(command: str, **extra: Any) -> WorkloadSpec:
    return new_spec(["sh", "-c", command], tenant="acme", **extra)


def texts(runtime: ProcessRuntime, handle: dict[str, Any], **kwargs: Any) -> list[str]:
    return [line.text for line in runtime.logs(handle, **kwargs)]


def exited(runtime: ProcessRuntime, handle: dict[str, Any]) -> bool:
    return runtime.poll(handle).state == "exited"


def test_it_is_a_runtime() -> None:
    assert isinstance(ProcessRuntime(Path("/nonexistent"), enabled=False), Runtime)


def test_a_disabled_runtime_refuses_every_call(workload_tmp: Path) -> None:
    runtime = ProcessRuntime(workload_tmp, enabled=False)
    handle = {"runtime": "process", "name": policy.container_name(TEST_INSTALLATION, 1, 0, 1)}
    calls = [
        lambda: runtime.start(spec("true")),
        lambda: runtime.poll(handle),
        lambda: runtime.stop(handle),
        lambda: runtime.logs(handle),
        lambda: runtime.list_managed(),
        lambda: runtime.info(),
        lambda: runtime.remove(handle),
    ]
    for call in calls:
        with pytest.raises(PermanentDriverError) as refused:
            call()
        assert refused.value.code == "process_runtime_disabled"
    assert list(workload_tmp.iterdir()) == []


def test_the_command_runs_with_only_its_environment_and_its_gpus(
    runtime: ProcessRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTROLLER_SECRET", "must-not-leak")
    script = 'echo "gpus=$CUDA_VISIBLE_DEVICES mine=$MINE secret=${CONTROLLER_SECRET:-none}"; exit 4'
    handle = runtime.start(spec(script, env={"MINE": "yes"}, gpu_uuids=["GPU-a", "GPU-b"]))
    assert wait_for(lambda: exited(runtime, handle))
    assert texts(runtime, handle) == ["gpus=GPU-a,GPU-b mine=yes secret=none"]
    status = runtime.poll(handle)
    assert (status.state, status.exit_code) == ("exited", 4)
    assert status.started_at and status.finished_at


def test_without_gpus_cuda_visible_devices_is_set_and_empty(runtime: ProcessRuntime) -> None:
    handle = runtime.start(spec('echo "[${CUDA_VISIBLE_DEVICES-unset}]"'))
    assert wait_for(lambda: exited(runtime, handle))
    assert texts(runtime, handle) == ["[]"]


def test_logs_keep_streams_apart_and_resume_after_any_cursor(runtime: ProcessRuntime) -> None:
    handle = runtime.start(spec("echo o1; echo e1 >&2; printf 'a\\nb\\n'; echo e2 >&2; printf tail"))
    assert wait_for(lambda: exited(runtime, handle))
    lines = list(runtime.logs(handle))
    assert [line.text for line in lines if line.stream == "stdout"] == ["o1", "a", "b", "tail"]
    assert [line.text for line in lines if line.stream == "stderr"] == ["e1", "e2"]
    assert [line.timestamp for line in lines] == sorted(line.timestamp for line in lines)
    for seen, line in enumerate(lines):
        assert list(runtime.logs(handle, since=line.cursor)) == lines[seen + 1 :]
    with pytest.raises(PermanentDriverError):
        runtime.logs(handle, since="2024-01-01T00:00:00Z")


def test_follow_streams_until_exit_and_times_out_while_running(runtime: ProcessRuntime) -> None:
    handle = runtime.start(spec("for i in 1 2 3; do echo $i; sleep 0.1; done"))
    assert texts(runtime, handle, follow=True, timeout=10) == ["1", "2", "3"]
    forever = runtime.start(spec("echo started; sleep 30"))
    seen: list[str] = []
    with pytest.raises(DriverTimeout):
        seen.extend(line.text for line in runtime.logs(forever, follow=True, timeout=0.5))
    assert seen == ["started"]


def test_stop_lets_a_trapping_command_exit_cleanly(runtime: ProcessRuntime) -> None:
    handle = runtime.start(spec(TRAPS_TERM))
    assert wait_for(lambda: "ready" in texts(runtime, handle))
    began = time.monotonic()
    status = runtime.stop(handle, grace_seconds=10)
    assert (status.state, status.exit_code) == ("exited", 0)
    assert time.monotonic() - began < 5
    assert "bye" in texts(runtime, handle)


def test_stop_kills_a_command_that_ignores_sigterm_after_the_grace_period(runtime: ProcessRuntime) -> None:
    handle = runtime.start(spec(IGNORES_TERM))
    assert wait_for(lambda: "ready" in texts(runtime, handle))
    began = time.monotonic()
    status = runtime.stop(handle, grace_seconds=0.5)
    assert (status.state, status.exit_code) == ("exited", 137)
    assert 0.5 <= time.monotonic() - began < 5
    assert runtime.stop(handle) == status, "stopping again changes nothing"


def test_nothing_the_command_started_outlives_it(runtime: ProcessRuntime) -> None:
    handle = runtime.start(spec("sleep 30 & echo $!"))
    assert wait_for(lambda: exited(runtime, handle))
    orphan = int(texts(runtime, handle)[0])
    assert wait_for(lambda: not Path(f"/proc/{orphan}").exists() or "Z" in _state(orphan), timeout=5)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_a_retried_start_adopts_the_running_workload(runtime: ProcessRuntime, workload_tmp: Path) -> None:
    workload = spec("echo started; sleep 30")
    first = runtime.start(workload)
    assert ProcessRuntime(workload_tmp / "work", enabled=True).start(workload) == first
    assert wait_for(lambda: texts(runtime, first) == ["started"])
    time.sleep(0.2)
    assert texts(runtime, first) == ["started"], "the command ran once"
    impostor = WorkloadSpec(**{**workload.__dict__, "workload_id": "someone-else"})
    with pytest.raises(PermanentDriverError) as conflict:
        runtime.start(impostor)
    assert conflict.value.code == "name_conflict"


def test_concurrent_starts_run_the_command_once(runtime: ProcessRuntime, workload_tmp: Path) -> None:
    workload = spec("echo started; sleep 30")
    with ThreadPoolExecutor(4) as pool:
        handles = list(
            pool.map(lambda _: ProcessRuntime(workload_tmp / "work", enabled=True).start(workload), range(4))
        )
    assert all(handle == handles[0] for handle in handles)
    assert wait_for(lambda: texts(runtime, handles[0]) == ["started"])
    time.sleep(0.2)
    assert texts(runtime, handles[0]) == ["started"]


def test_a_restarted_controller_finds_polls_and_stops_what_was_running(
    runtime: ProcessRuntime, workload_tmp: Path
) -> None:
    handle = runtime.start(spec(TRAPS_TERM, replica=1, attempt=2))
    assert wait_for(lambda: "ready" in texts(runtime, handle))
    restarted = ProcessRuntime(workload_tmp / "work", enabled=True)
    [found] = restarted.list_managed()
    assert (found.name, found.state, found.attempt, found.replica, found.handle) == (
        handle["name"],
        "running",
        2,
        1,
        handle,
    )
    assert restarted.stop(found.handle, grace_seconds=5).exit_code == 0


def test_a_refused_environment_runs_nothing(runtime: ProcessRuntime) -> None:
    with pytest.raises(SpecRefused) as refused:
        runtime.start(spec("true", env={"LD_PRELOAD": "/home/user/evil.so"}))
    assert refused.value.field == "env.LD_PRELOAD"
    assert not runtime.work_dir.exists() or list(runtime.work_dir.iterdir()) == []


def test_a_command_that_cannot_run_exits_127(runtime: ProcessRuntime) -> None:
    handle = runtime.start(new_spec(["/nonexistent/binary"], tenant="acme"))
    assert wait_for(lambda: exited(runtime, handle))
    assert runtime.poll(handle).exit_code == 127
    assert "cannot run the command" in texts(runtime, handle)[0]


def test_a_workload_without_a_command_fails_at_once_saying_why(runtime: ProcessRuntime) -> None:
    # No image to take a default command from: the start ends at once (not after the start budget), with 127.
    started = time.monotonic()
    handle = runtime.start(new_spec([], tenant="acme"))
    assert wait_for(lambda: exited(runtime, handle))
    assert time.monotonic() - started < 10
    assert runtime.poll(handle).exit_code == 127
    assert "give the workload a command" in texts(runtime, handle)[0]


def test_remove_kills_and_forgets(runtime: ProcessRuntime) -> None:
    handle = runtime.start(spec("sleep 30"))
    runtime.remove(handle)
    assert runtime.poll(handle).state == "missing"
    assert runtime.stop(handle).state == "missing"
    runtime.remove(handle)


def test_health_check_reports_exit_code_and_output(runtime: ProcessRuntime) -> None:
    status = run_health_check(
        runtime,
        installation="",
        image="ignored",
        command=["sh", "-c", "echo broken >&2; exit 3"],
        gpu_uuids=[],
        timeout=10,
    )
    assert (status.exit_code, status.message) == (3, "broken")
    assert runtime.list_managed() == []


def test_info_says_not_isolated(runtime: ProcessRuntime) -> None:
    info = runtime.info()
    assert (info.kind, info.isolated, info.simulated) == ("process", False, False)
    assert info.cpu_cores == os.cpu_count() and info.memory_mib and info.memory_mib > 0


# A stdlib HTTP server on the port the runtime chose, serving a page that names it.
SERVE = 'echo "served on $SERVE_PORT" > index.html && exec $PY -m http.server --bind 127.0.0.1 "$SERVE_PORT"'


def served(endpoint: str) -> str | None:
    try:
        response = httpx.get(f"{endpoint}/index.html", timeout=2)
    except httpx.TransportError:
        return None
    return response.text if response.status_code == 200 else None


def serves(endpoint: str, page: str) -> bool:
    return served(endpoint) == page


def server_spec(**extra: Any) -> WorkloadSpec:
    return spec(
        SERVE, env={"PY": " ".join(workload_python())}, service_port=8888, service_port_env="SERVE_PORT", **extra
    )


def test_a_service_port_gets_a_free_loopback_port_that_answers_at_the_endpoint(runtime: ProcessRuntime) -> None:
    first, second = runtime.start(server_spec()), runtime.start(server_spec())
    assert first["endpoint"].startswith("http://127.0.0.1:") and first["endpoint"] != second["endpoint"]
    for endpoint in (first["endpoint"], second["endpoint"]):
        assert wait_for(functools.partial(serves, endpoint, f"served on {endpoint.rsplit(':', 1)[1]}\n"))


def test_an_adopted_or_listed_workload_keeps_its_endpoint(runtime: ProcessRuntime, workload_tmp: Path) -> None:
    workload = server_spec(replica=1)
    handle = runtime.start(workload)
    assert wait_for(lambda: served(handle["endpoint"]) is not None)
    restarted = ProcessRuntime(workload_tmp / "work", enabled=True)
    assert restarted.start(workload) == handle
    assert [found.handle for found in restarted.list_managed()] == [handle]
    assert served(handle["endpoint"]) is not None, "adopting launched nothing new"


def test_without_a_variable_the_workload_serves_its_own_port(runtime: ProcessRuntime) -> None:
    handle = runtime.start(spec("sleep 30", service_port=18888))
    assert handle["endpoint"] == "http://127.0.0.1:18888"
    assert "endpoint" not in runtime.start(spec("sleep 30"))
