"""Real servers on 127.0.0.1 for the notification tests: an SMTP server (aiosmtpd) and scripted HTTP receivers."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aiosmtpd.controller import Controller


@dataclass
class Mailbox:
    """What the SMTP server received: (envelope recipients, parsed message) per e-mail."""

    received: list[tuple[list[str], Message]] = field(default_factory=list)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.received.append((list(envelope.rcpt_tos), message_from_bytes(envelope.content)))
        return "250 Message accepted for delivery"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def smtp_server() -> Iterator[tuple[Mailbox, int]]:
    """Run a real SMTP server on 127.0.0.1 for the block; yield its mailbox and port."""
    mailbox = Mailbox()
    port = free_port()
    controller = Controller(mailbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield mailbox, port
    finally:
        controller.stop()


@dataclass
class Received:
    """One request a receiver got: path, headers (lower-cased names) and the raw body."""

    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """A scripted HTTP receiver: answers each POST with the next status of `script` (the last one repeats)."""

    script: list[int]
    answer: bytes = b""
    requests: list[Received] = field(default_factory=list)
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_status(self, request: Received) -> int:
        with self.lock:
            self.requests.append(request)
            index = min(len(self.requests), len(self.script)) - 1
            return self.script[index]


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            headers = {name.lower(): value for name, value in self.headers.items()}
            status = receiver.next_status(Received(path=self.path, headers=headers, body=body))
            self.send_response(status)
            self.send_header("Content-Length", str(len(receiver.answer)))
            self.end_headers()
            self.wfile.write(receiver.answer)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler


@contextmanager
def http_receiver(script: list[int], *, answer: bytes = b"") -> Iterator[Receiver]:
    """Run an HTTP receiver on 127.0.0.1 for the block; its URL is `receiver.url`."""
    receiver = Receiver(script=script, answer=answer)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/gpucloud"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
