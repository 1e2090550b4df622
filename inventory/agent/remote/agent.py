"""The remote agent put together: reporter and executor feeding the spool, the sender, the command poller.

Everything the co-located agent sends through Celery, the controller's
mailbox and the channel layer goes to `Spool` (heartbeats, task reports)
or `LiveSamples` (GPU samples) here, and the sender posts it. The
reporter and executor are the co-located agent's own, unchanged.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from common.protocol.messages import BY_TASK, Heartbeat
from inventory.agent.config import AgentConfig, activate, config_from_settings
from inventory.agent.egress import keep_egress
from inventory.agent.executor import Executor, install_executor
from inventory.agent.remote.client import POLL_TIMEOUT, POLL_WAIT_SECONDS, ConsoleClient, check_console_url
from inventory.agent.remote.commands import CommandPoller, CommandRunner, agent_tasks
from inventory.agent.remote.credential import Credential
from inventory.agent.remote.sender import Sender
from inventory.agent.remote.spool import DEFAULT_MAX_BYTES, LiveSamples, Spool
from inventory.agent.reporter import Reporter
from inventory.agent.runner import AGENT_THREADS, probe_for

log = logging.getLogger(__name__)

SPOOL_FILE = "spool.sqlite3"
# At exit, what waits is sent for at most this long; the rest stays on disk for the next start.
FLUSH_SECONDS = 10.0


@dataclass(frozen=True)
class RemoteOptions:
    """How this host runs its agent, beyond what the credential says.

    `ca_file` overrides the credential's; `process_enabled` None keeps
    GPUCLOUD_AGENT_PROCESS_RUNTIME; `allow_http` accepts a plain-HTTP
    console beyond loopback.
    """

    work_dir: Path
    probe: str = "nvml"
    simulated_gpus: int = 8
    process_enabled: bool | None = None
    ca_file: str | None = None
    allow_http: bool = False
    spool_max_bytes: int = DEFAULT_MAX_BYTES
    flush_seconds: float = FLUSH_SECONDS
    poll_wait: int = POLL_WAIT_SECONDS


def agent_config(credential: Credential, options: RemoteOptions) -> AgentConfig:
    """Return the configuration of the agent of `credential`'s node, with the cadence the console asked for."""
    overrides: dict[str, object] = {
        "work_dir": options.work_dir,
        "probe": options.probe,
        "simulated_gpu_count": options.simulated_gpus,
    }
    if options.process_enabled is not None:
        overrides["process_enabled"] = options.process_enabled
    if credential.sample_seconds:
        overrides["sample_seconds"] = credential.sample_seconds
    if credential.heartbeat_seconds:
        overrides["heartbeat_seconds"] = credential.heartbeat_seconds
    return config_from_settings(credential.node, **overrides)


class RemoteAgent:
    """One node's agent talking to the console over HTTP(S) only; `start` it, then `stop` it."""

    def __init__(self, credential: Credential, options: RemoteOptions) -> None:
        console = check_console_url(credential.console, allow_http=options.allow_http)
        ca_file = options.ca_file or credential.ca_file
        self.config = agent_config(credential, options)
        self.options = options
        self._reports = ConsoleClient(console, credential=credential.credential, ca_file=ca_file)
        self._commands = ConsoleClient(console, credential=credential.credential, ca_file=ca_file, timeout=POLL_TIMEOUT)
        self.live = LiveSamples()
        self.spool = Spool(self.config.work_dir / SPOOL_FILE, max_bytes=options.spool_max_bytes)
        self.sender = Sender(self.spool, self.live, self._reports.post_reports)
        self.spool.on_put = self.live.on_put = self.sender.wake
        self.executor: Executor | None = None
        self.reporter: Reporter | None = None
        self.poller: CommandPoller | None = None

    def start(self) -> None:
        """Activate the node's configuration and start sending, polling for commands, sampling and reporting."""
        activate(self.config)
        keep_egress(self.config)
        self.executor = install_executor(self.config, send=self.spool_task)
        self.sender.start()
        runner = CommandRunner(agent_tasks(), self.spool.put, threads=AGENT_THREADS)
        self.poller = CommandPoller(lambda acks: self._commands.poll_commands(self.options.poll_wait, acks), runner)
        self.poller.start()
        self.reporter = Reporter(
            node=self.config.node,
            probe=probe_for(self.config),
            send_report=self.spool_heartbeat,
            publish=self.publish_samples,
            sample_seconds=self.config.sample_seconds,
            heartbeat_seconds=self.config.heartbeat_seconds,
        )
        self.reporter.start_thread()

    def spool_task(self, task: str, **kwargs: Any) -> None:
        """The executor's `send`: spool one task report (`jobs.replica_started`, log batches, ...) with the
        version of its message this agent writes, which the gateway checks and passes on."""
        self.spool.put({"kind": "task", "task": task, "version": BY_TASK[task].VERSION, "kwargs": kwargs})

    def spool_heartbeat(self, report: dict[str, Any]) -> None:
        """The reporter's `send_report`: spool one heartbeat, with the version of its message."""
        self.spool.put({"kind": "heartbeat", "version": Heartbeat.VERSION, "report": report})

    def publish_samples(self, group: str, samples: list[dict[str, Any]]) -> None:
        """The reporter's `publish`: keep the latest samples for the next batch (the console knows the group)."""
        self.live.put(samples)

    def stop(self, flush_seconds: float | None = None) -> bool:
        """Stop sampling and polling, send what waits for at most `flush_seconds`; return whether all of it left."""
        for part in (self.reporter, self.poller):
            if part is not None:
                part.stop()
        if self.executor is not None:
            # Log batches and pull progress still in memory go to the spool, so they survive the exit.
            self.executor.outbox.flush()
            self.executor.pulls.flush()
        delivered = self.sender.flush(self.options.flush_seconds if flush_seconds is None else flush_seconds)
        self._reports.close()
        self._commands.close()
        if delivered:
            self.spool.close()
        return delivered


def run_remote_agent(credential: Credential, options: RemoteOptions) -> bool:
    """Run the agent of `credential`'s node until SIGTERM or SIGINT, then flush; return whether all was delivered.

    Call from the main thread (it installs the signal handlers). Raises
    RemoteAgentError when it cannot start: a console URL it refuses, an
    unreadable CA file, a spool another agent process holds.
    """
    stopping = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    agent = RemoteAgent(credential, options)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, request_stop)
    agent.start()
    log.info("agent of node %s started; reporting to %s", credential.node, credential.console)
    while not stopping.wait(1.0):
        pass
    log.info("agent of node %s stopping: sending what waits (at most %.0f s)", credential.node, options.flush_seconds)
    delivered = agent.stop()
    if not delivered:
        log.warning("%d messages wait in %s; they are sent after the next start", len(agent.spool), agent.spool.path)
    return delivered
