"""The remote agent over real HTTP: back-off, the sender and the command poller against a scripted console,
the whole agent in this process, and `gpucloud agent join|run` as separate processes without the console's secrets.

The console is `ConsoleStub`, a real socket server on loopback that answers
200, 401, 403 or 503 or cuts the connection, as scripted.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from common.protocol.messages import ListReplicas, ReplicaExited, StopReplica
from inventory.agent import config as config_module
from inventory.agent import executor as executor_module
from inventory.agent.remote.agent import SPOOL_FILE, RemoteAgent, RemoteOptions
from inventory.agent.remote.backoff import Backoff
from inventory.agent.remote.client import POLL_TIMEOUT, POLL_WAIT_SECONDS, ConsoleClient, Delivery
from inventory.agent.remote.commands import CommandPoller, CommandRunner
from inventory.agent.remote.credential import Credential, load_credential
from inventory.agent.remote.join import join_console
from inventory.agent.remote.sender import Sender
from inventory.agent.remote.spool import LiveSamples, Spool
from tests.inventory.console_stub import ANSWER_DROP, ConsoleStub
from tests.workers import wait_until

ROOT = Path(__file__).resolve().parents[2]
SECRET = "node-secret"


@pytest.fixture
def stub() -> Iterator[ConsoleStub]:
    console = ConsoleStub(credential=SECRET).start()
    yield console
    console.stop()


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[Spool]:
    opened = Spool(tmp_path / SPOOL_FILE)
    yield opened
    opened.close()


def _fast_backoff() -> Backoff:
    return Backoff(base=0.01, cap=0.05, unauthorized_cap=0.05)


@pytest.fixture
def sender(stub: ConsoleStub, spool: Spool) -> Iterator[Sender]:
    """A sender to `stub`, not started; it is stopped after the test."""
    client = ConsoleClient(stub.url, credential=SECRET)
    live = LiveSamples()
    made = Sender(spool, live, client.post_reports, backoff=_fast_backoff())
    spool.on_put = live.on_put = made.wake
    yield made
    made.stop()
    assert made.join(10), "the sender stops"
    client.close()


def _task(number: int, padding: int = 0) -> dict[str, Any]:
    return {"kind": "task", "task": ReplicaExited.TASK, "kwargs": {"n": number, "pad": "x" * padding}}


def _numbers(stub: ConsoleStub) -> list[int]:
    return [message["kwargs"]["n"] for message in stub.messages("task")]


# --- back-off ------------------------------------------------------------------------------------


def test_backoff_doubles_from_half_a_second_to_its_cap_and_starts_over_after_a_success() -> None:
    ceiling = Backoff(draw=lambda low, high: high)
    assert [ceiling.next_delay() for _ in range(7)] == [0.5, 1, 2, 4, 8, 10, 10]
    assert [ceiling.next_delay(unauthorized=True) for _ in range(2)] == [60, 60], "a revoked credential waits longer"
    ceiling.reset()
    assert ceiling.next_delay() == 0.5
    jittered = Backoff()
    delays = [jittered.next_delay() for _ in range(200)]
    assert all(0 <= delay <= 10 for delay in delays) and len(set(delays)) > 150, "full jitter: anywhere below"


# --- TLS ------------------------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    assert openssl is not None, "the TLS test makes its certificates with openssl (Debian: openssl)"
    subprocess.run([openssl, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture
def private_ca(tmp_path: Path) -> tuple[Path, tuple[Path, Path]]:
    """Return a private CA's certificate and a server certificate (chain, key) it signed for 127.0.0.1."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=gpucloud test CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=tmp_path)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=127.0.0.1", cwd=tmp_path)  # fmt: skip
    (tmp_path / "server.ext").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.pem", "-days", "1", "-extfile", "server.ext", cwd=tmp_path)  # fmt: skip
    return tmp_path / "ca.pem", (tmp_path / "server.pem", tmp_path / "server.key")


def test_tls_is_verified_and_a_private_ca_is_trusted_only_when_named(
    private_ca: tuple[Path, tuple[Path, Path]], tmp_path: Path
) -> None:
    ca_file, certificate = private_ca
    console = ConsoleStub(credential=SECRET).start(certificate=certificate)
    try:
        assert console.url.startswith("https://127.0.0.1:")
        untrusting = ConsoleClient(console.url, credential=SECRET)
        refused = untrusting.post_reports([_task(1)])
        untrusting.close()
        assert refused.delivery is Delivery.FAILED and "CERTIFICATE_VERIFY_FAILED" in refused.detail
        trusting = ConsoleClient(console.url, credential=SECRET, ca_file=str(ca_file))
        assert trusting.post_reports([_task(2)]).delivery is Delivery.DELIVERED
        trusting.close()
        credential = join_console(console.url, "tok", path=tmp_path / "agent.json", ca_file=str(ca_file))
    finally:
        console.stop()
    assert _numbers(console) == [2]
    assert credential.ca_file == str(ca_file) and load_credential(tmp_path / "agent.json").ca_file == str(ca_file)


# --- the sender ----------------------------------------------------------------------------------


def test_the_sender_ships_the_spool_in_order_in_batches_of_at_most_500_and_empties_it(
    stub: ConsoleStub, spool: Spool, sender: Sender
) -> None:
    for number in range(1200):
        spool.put(_task(number))
    sender.start()
    assert wait_until(lambda: len(spool) == 0)
    assert _numbers(stub) == list(range(1200))
    assert [len(batch) for batch in stub.batches] == [500, 500, 200]
    assert sender.delivered == 1200


def test_a_batch_holds_at_most_a_mebibyte(stub: ConsoleStub, spool: Spool, sender: Sender) -> None:
    for number in range(30):
        spool.put(_task(number, padding=100_000))
    sender.start()
    assert wait_until(lambda: len(spool) == 0)
    assert [len(batch) for batch in stub.batches] == [10, 10, 10]
    assert _numbers(stub) == list(range(30))


def test_failures_and_cut_connections_are_retried_in_order_without_loss_or_duplicates(
    stub: ConsoleStub, spool: Spool, sender: Sender
) -> None:
    stub.report_script.extend([503, ANSWER_DROP, 429, 500, ANSWER_DROP])
    for number in range(50):
        spool.put(_task(number))
    sender.start()
    for number in range(50, 100):  # more arrive while the console is failing
        spool.put(_task(number))
        time.sleep(0.002)
    assert wait_until(lambda: len(spool) == 0 and len(_numbers(stub)) == 100)
    assert stub.answers[:5] == [503, ANSWER_DROP, 429, 500, ANSWER_DROP]
    assert _numbers(stub) == list(range(100))
    assert sender.backoff.failures == 0, "a success resets the back-off"


def test_a_batch_the_console_refuses_for_good_is_dropped_and_logged_not_retried(
    stub: ConsoleStub, spool: Spool, sender: Sender, caplog: pytest.LogCaptureFixture
) -> None:
    stub.report_script.append(403)
    for number in range(5):
        spool.put(_task(number))
    with caplog.at_level(logging.ERROR):
        sender.start()
        assert wait_until(lambda: len(spool) == 0)
        for number in range(5, 10):
            spool.put(_task(number))
        assert wait_until(lambda: len(_numbers(stub)) == 5)
    assert _numbers(stub) == list(range(5, 10)) and sender.rejected == 5
    assert "refused a batch of 5 messages" in caplog.text and "scripted 403" in caplog.text


def test_a_revoked_credential_keeps_the_spool_and_retries_until_it_is_accepted_again(
    stub: ConsoleStub, spool: Spool, sender: Sender, caplog: pytest.LogCaptureFixture
) -> None:
    stub.credential = "rotated"
    for number in range(20):
        spool.put(_task(number))
    with caplog.at_level(logging.ERROR):
        sender.start()
        assert wait_until(lambda: stub.unauthorized >= 3)
    assert len(spool) == 20, "nothing is dropped on 401"
    assert "credential revoked or unknown: re-join" in caplog.text
    stub.credential = SECRET  # an operator re-enabled the node
    assert wait_until(lambda: len(spool) == 0)
    assert _numbers(stub) == list(range(20))


def test_a_quiet_node_sends_at_once_and_a_busy_one_at_most_ten_times_a_second(
    stub: ConsoleStub, spool: Spool, sender: Sender
) -> None:
    sender.start()
    time.sleep(0.3)  # the sender is idle, waiting
    put_at = time.monotonic()
    spool.put(_task(0))
    assert wait_until(lambda: _numbers(stub) == [0], interval=0.002)
    assert time.monotonic() - put_at < 0.2, "a quiet node's report leaves at once"
    posts_before, started = len(stub.answers), time.monotonic()
    for number in range(1, 201):  # a busy second: a report every 5 ms
        spool.put(_task(number))
        time.sleep(0.005)
    assert wait_until(lambda: len(_numbers(stub)) == 201)
    elapsed = time.monotonic() - started
    assert len(stub.answers) - posts_before <= elapsed / 0.1 + 3, "batched, not one post per report"
    assert _numbers(stub) == list(range(201))


def test_live_samples_ride_at_the_end_of_a_batch_and_never_wait_on_disk(
    stub: ConsoleStub, spool: Spool, sender: Sender
) -> None:
    for number in range(3):
        spool.put(_task(number))
    sender.live.put([{"uuid": "GPU-1", "utilization_gpu": 50.0}])
    sender.start()
    assert wait_until(lambda: stub.batches)
    assert [m["kind"] for m in stub.batches[0]] == ["task", "task", "task", "samples"]
    assert stub.batches[0][-1]["samples"] == [{"uuid": "GPU-1", "utilization_gpu": 50.0}]
    sender.live.put([{"uuid": "GPU-1", "utilization_gpu": 60.0}])
    assert wait_until(lambda: len(stub.messages("samples")) == 2), "samples alone wake the sender too"
    assert len(spool) == 0


def test_flush_sends_what_waits_and_stops_at_the_first_failure(stub: ConsoleStub, spool: Spool, sender: Sender) -> None:
    for number in range(700):
        spool.put(_task(number))
    assert sender.flush(timeout=10) is True and _numbers(stub) == list(range(700))
    stub.report_script.append(503)
    spool.put(_task(700))
    assert sender.flush(timeout=10) is False and len(spool) == 1, "what is left waits on disk for the next start"


# --- commands ------------------------------------------------------------------------------------


def test_the_poller_runs_commands_on_the_agents_threads_and_spools_their_results(
    stub: ConsoleStub, caplog: pytest.LogCaptureFixture
) -> None:
    assert POLL_TIMEOUT.read is not None and POLL_TIMEOUT.read > POLL_WAIT_SECONDS
    results: list[dict[str, Any]] = []
    ran = threading.Event()

    def explode() -> None:
        raise RuntimeError("boom")

    handlers: dict[str, Callable[..., Any]] = {
        "agent.add": lambda a, b=0: {"sum": a + b},
        "agent.nothing": lambda **kwargs: ran.set(),
        "agent.explode": explode,
    }
    runner = CommandRunner(handlers, results.append, threads=2)
    client = ConsoleClient(stub.url, credential=SECRET)
    poller = CommandPoller(lambda acks: client.poll_commands(wait=1, acks=acks), runner, backoff=_fast_backoff())
    stub.command_script.extend([503, ANSWER_DROP])
    for command in (
        {"id": "c1", "task": "agent.explode", "args": [], "kwargs": {}},
        {"id": "c2", "task": "agent.unknown", "args": [], "kwargs": {}},
        {"id": "c3", "task": "agent.add", "args": [2], "kwargs": {"b": 3}},
        {"id": "c4", "task": "agent.nothing", "args": [], "kwargs": {"x": 1}},
    ):
        stub.commands.put(command)
    with caplog.at_level(logging.WARNING):
        poller.start()
        assert wait_until(lambda: results and ran.is_set())
    poller.stop()
    client.close()
    assert results == [{"kind": "result", "id": "c3", "result": {"sum": 5}}], "only a value is sent back"
    assert "unknown task 'agent.unknown'" in caplog.text and "command c1 (agent.explode) failed" in caplog.text


def test_a_command_of_a_protocol_version_this_agent_does_not_read_is_not_run(caplog: pytest.LogCaptureFixture) -> None:
    ran: list[dict[str, Any]] = []
    runner = CommandRunner({StopReplica.TASK: lambda **kwargs: ran.append(kwargs)}, print, threads=1)
    kwargs = {"node": "gpu-1", "runtime": "simulated", "name": "r", "workload_id": 1, "attempt": 1, "replica": 0}
    with caplog.at_level(logging.ERROR):
        runner.run({"id": "v2", "task": StopReplica.TASK, "version": StopReplica.VERSION + 1, "kwargs": kwargs})
    assert ran == [] and "this agent reads version" in caplog.text
    runner.run({"id": "v1", "task": StopReplica.TASK, "version": StopReplica.VERSION, "kwargs": kwargs})
    runner.run({"id": "v0", "task": StopReplica.TASK, "kwargs": kwargs})  # a console that named no version
    assert ran == [kwargs, kwargs]


def test_the_poller_backs_off_on_a_revoked_credential(stub: ConsoleStub, caplog: pytest.LogCaptureFixture) -> None:
    stub.credential = "rotated"
    client = ConsoleClient(stub.url, credential=SECRET)
    poller = CommandPoller(lambda acks: client.poll_commands(wait=1, acks=acks), CommandRunner({}, print, threads=1))
    with caplog.at_level(logging.ERROR):
        delays = [poller.poll_once() for _ in range(4)]
    assert client.post_reports([]).delivery is Delivery.UNAUTHORIZED
    client.close()
    assert all(delay >= 0 for delay in delays) and poller.backoff.failures == 4
    assert "credential revoked or unknown: re-join" in caplog.text


# --- the whole agent, in this process ---------------------------------------------------------------


@pytest.fixture
def own_agent_globals(monkeypatch: pytest.MonkeyPatch) -> None:
    """Give back this process's executor and active agent configuration after the test."""
    monkeypatch.setattr(executor_module, "_executor", None)
    monkeypatch.setattr(config_module, "_active", None)


def test_a_remote_agent_heartbeats_streams_samples_and_answers_commands_over_http(
    stub: ConsoleStub, tmp_path: Path, own_agent_globals: None
) -> None:
    credential = Credential(
        console=stub.url, node="gpu-1", credential=SECRET, sample_seconds=0.2, heartbeat_seconds=0.5
    )
    agent = RemoteAgent(credential, RemoteOptions(work_dir=tmp_path / "gpu-1", probe="simulated", simulated_gpus=2))
    probe = {
        "node": "gpu-1",
        "attempt": 1,
        "runtime": "simulated",
        "simulated_gpu_count": 2,
        "health_check": {"image": "busybox", "command": ["true"]},
    }
    stub.commands.put({"id": "p1", "task": "agent.probe_node", "args": [probe], "kwargs": {}})
    stub.commands.put({"id": "l1", "task": ListReplicas.TASK, "args": ["gpu-1", "simulated"], "kwargs": {}})
    agent.start()
    try:
        assert wait_until(lambda: stub.messages("result") and stub.messages("task"), timeout=20)
        assert wait_until(lambda: len(stub.messages("heartbeat")) >= 2 and stub.messages("samples"))
    finally:
        assert agent.stop(flush_seconds=5) is True
    result = stub.messages("result")[0]
    assert result["id"] == "p1" and len(result["result"]["gpus"]["gpus"]) == 2
    assert result["result"]["health_check"]["exit_code"] == 0
    inventory = stub.messages("task")[0]
    assert inventory["task"] == "jobs.node_replicas" and inventory["kwargs"]["node"] == "gpu-1"
    heartbeat = stub.messages("heartbeat")[0]["report"]
    assert heartbeat["node"] == "gpu-1" and len(heartbeat["samples"]) == 2
    assert len(stub.messages("samples")[0]["samples"]) == 2
    assert (tmp_path / "gpu-1" / SPOOL_FILE).exists()


# --- the command line, as separate processes without the console's secrets -----------------------------


def _agent_command(*args: str) -> list[str]:
    return [sys.executable, "-c", "from gpucloud.cli import main; main()", "agent", *args]


def _agent_environ(tmp_path: Path) -> dict[str, str]:
    secrets = ("SECRET_KEY", "DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "GPUCLOUD_ROLE")
    environ = {name: value for name, value in os.environ.items() if name not in secrets}
    environ["GPUCLOUD_DATA_DIR"] = str(tmp_path / "data")
    return environ


def _run_agent(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _agent_command(*args), cwd=ROOT, env=_agent_environ(tmp_path), capture_output=True, text=True, timeout=60
    )


def test_join_stores_a_private_credential_and_a_refused_token_exits_with_the_consoles_reason(
    stub: ConsoleStub, tmp_path: Path
) -> None:
    path = tmp_path / "etc" / "agent.json"
    joined = _run_agent(tmp_path, "join", stub.url + "/", "tok-1", "--credential-file", str(path), "--no-run")
    assert joined.returncode == 0, joined.stderr
    assert "as node gpu-1" in joined.stdout
    assert stub.joins[0]["token"] == "tok-1" and stub.joins[0]["hostname"] and stub.joins[0]["agent_version"]
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    stored = load_credential(path)
    assert (stored.console, stored.node, stored.credential) == (stub.url, "gpu-1", SECRET)

    again = _run_agent(tmp_path, "join", stub.url, "tok-2", "--credential-file", str(path), "--no-run")
    assert again.returncode != 0 and "--force" in again.stderr
    assert len(stub.joins) == 1, "the token is not spent when the credential cannot be stored"

    stub.join_answer = (403, {"detail": "This join token was already used."})
    refused = _run_agent(tmp_path, "join", stub.url, "tok-1", "--credential-file", str(tmp_path / "b.json"), "--no-run")
    assert refused.returncode != 0 and "This join token was already used." in refused.stderr
    assert not (tmp_path / "b.json").exists()
    assert not (tmp_path / "data").exists(), "the agent role keeps no secret key or database"


def test_join_refuses_a_plain_http_console_beyond_loopback_before_sending_the_token(tmp_path: Path) -> None:
    refused = _run_agent(
        tmp_path, "join", "http://console.example.com", "tok", "--credential-file", str(tmp_path / "a.json")
    )
    assert refused.returncode != 0 and "--allow-http" in refused.stderr
    assert not (tmp_path / "a.json").exists()


def test_agent_run_reports_from_the_stored_credential_and_stops_cleanly_on_sigterm(
    stub: ConsoleStub, tmp_path: Path
) -> None:
    path = tmp_path / "agent.json"
    assert _run_agent(tmp_path, "join", stub.url, "tok", "--credential-file", str(path), "--no-run").returncode == 0
    command = _agent_command("run", "--credential-file", str(path), "--probe", "simulated", "--simulated-gpus", "2")
    agent = subprocess.Popen(command, cwd=ROOT, env=_agent_environ(tmp_path), stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: stub.messages("heartbeat"), timeout=60), "no heartbeat from the agent"
        agent.send_signal(signal.SIGTERM)
        _, stderr = agent.communicate(timeout=30)
    finally:
        agent.kill()
    assert agent.returncode == 0, stderr
    assert stub.messages("heartbeat")[0]["report"]["node"] == "gpu-1"
    assert (tmp_path / "gpu-1" / SPOOL_FILE).exists(), "the work directory is beside the credential"
    assert not (tmp_path / "data").exists()
