"""A real HTTP server on loopback that plays the console's agent API, with scripted failures.

It speaks the wire protocol of `inventory.agent.remote` (join, reports,
commands) and records what it got. `report_script` and `command_script`
hold the answers to give next, in order (`ANSWER_DROP` closes the
connection without answering); once they are used up, reports are taken
(200) and commands handed out from `commands`. A request whose
`Authorization` is not `Node <credential>` gets 401, as a revoked
credential does. bench/agent_spool.py uses it too.
"""

from __future__ import annotations

import contextlib
import json
import queue
import ssl
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

ANSWER_DROP = "drop"
Answer = int | str


class ConsoleStub:
    """The console as an agent sees it; `start` serves on a free loopback port (`url`), `stop` ends it."""

    def __init__(self, *, credential: str = "node-secret", node: str = "gpu-1", max_poll_wait: float = 0.5) -> None:
        self.credential, self.node, self.max_poll_wait = credential, node, max_poll_wait
        self.join_answer: tuple[int, dict[str, Any]] = (
            201,
            {"node": node, "credential": credential, "sample_seconds": 1.0, "heartbeat_seconds": 5.0},
        )
        self.report_script: deque[Answer] = deque()
        self.command_script: deque[Answer] = deque()
        self.commands: queue.Queue[dict[str, Any]] = queue.Queue()
        self.joins: list[dict[str, Any]] = []
        self.batches: list[list[dict[str, Any]]] = []  # every batch taken, in order
        self.answers: list[Answer] = []  # every answer to a report post, in order
        self.unauthorized = 0  # requests refused for their credential
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._tls = False

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"{'https' if self._tls else 'http'}://{host!s}:{port}"

    def messages(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Return every message taken so far (of `kind`), in the order they came."""
        with self.lock:
            return [m for batch in self.batches for m in batch if kind is None or m["kind"] == kind]

    def start(self, port: int = 0, *, certificate: tuple[Path, Path] | None = None) -> ConsoleStub:
        """Serve on `port` (0: any free one); HTTPS with `certificate` (its PEM chain and key files)."""
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._tls = certificate is not None
        if certificate is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*certificate)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _next(self, script: deque[Answer]) -> Answer:
        with self.lock:
            return script.popleft() if script else 200

    def take_reports(self, messages: list[dict[str, Any]]) -> tuple[Answer, dict[str, Any]]:
        answer = self._next(self.report_script)
        with self.lock:
            self.answers.append(answer)
            if answer == 200:
                self.batches.append(messages)
        return answer, {"accepted": len(messages)} if answer == 200 else {"detail": f"scripted {answer}"}

    def hand_out_commands(self, wait: float) -> tuple[Answer, dict[str, Any]]:
        answer = self._next(self.command_script)
        if answer != 200:
            return answer, {"detail": f"scripted {answer}"}
        found: list[dict[str, Any]] = []
        try:
            found.append(self.commands.get(timeout=min(wait, self.max_poll_wait)))
            while True:
                found.append(self.commands.get_nowait())
        except queue.Empty:
            pass
        return 200, {"commands": found}


def _handler(stub: ConsoleStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            path = urlsplit(self.path).path
            if path == "/api/v1/agent/join":
                with stub.lock:
                    stub.joins.append(body)
                self._answer(*stub.join_answer)
            elif path == "/api/v1/agent/reports" and self._authorized():
                self._answer(*stub.take_reports(body["messages"]))

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            if parts.path == "/api/v1/agent/commands" and self._authorized():
                wait = float(parse_qs(parts.query).get("wait", ["20"])[0])
                self._answer(*stub.hand_out_commands(wait))

        def _authorized(self) -> bool:
            if self.headers.get("Authorization") == f"Node {stub.credential}":
                return True
            with stub.lock:
                stub.unauthorized += 1
            self._answer(401, {"detail": "unknown or revoked credential"})
            return False

        def _answer(self, answer: Answer, body: dict[str, Any]) -> None:
            if answer == ANSWER_DROP:
                self.close_connection = True  # no status line at all: the client sees the connection cut
                return
            data = json.dumps(body).encode()
            self.send_response(int(answer))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            # The agent may have gone away mid-poll (it stopped): nobody is left to answer.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(data)

    return Handler
