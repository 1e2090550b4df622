"""The remote agent's HTTP client: join, post reports, long-poll commands; TLS verified by default.

Every answer of the console is sorted into a `Delivery` the caller acts on:
DELIVERED (2xx), REJECTED (400, 403, 413: this batch will never be taken,
so retrying it would block the spool forever), UNAUTHORIZED (401: the
credential is unknown or revoked) and FAILED (anything else: 5xx, 429, a
network error or a timeout; try again later). Redirects are never followed:
one to another host or to plain HTTP would carry the credential with it.
"""

from __future__ import annotations

import enum
import ipaddress
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from inventory.agent import AGENT_VERSION
from inventory.agent.remote import RemoteAgentError

JOIN_PATH = "/api/v1/agent/join"
REPORTS_PATH = "/api/v1/agent/reports"
COMMANDS_PATH = "/api/v1/agent/commands"
POLL_WAIT_SECONDS = 20
# A request's read may take this long; a long poll's read must outlast the console's wait.
REQUEST_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
POLL_TIMEOUT = httpx.Timeout(POLL_WAIT_SECONDS + 15.0, connect=10.0)
_REJECTED = {400, 403, 413}


class ConsoleUrlRefused(RemoteAgentError):
    """The console URL is not one the agent sends its credential to (plain HTTP beyond loopback, or not HTTP)."""


class JoinRefused(RemoteAgentError):
    """The console refused the join token (bad, used or expired) or could not be asked; the message says which."""


class Delivery(enum.Enum):
    DELIVERED = "delivered"
    REJECTED = "rejected"
    UNAUTHORIZED = "unauthorized"
    FAILED = "failed"


@dataclass(frozen=True)
class Reply:
    """What became of one request: its `Delivery`, the HTTP status (0: no answer) and the body or the error."""

    delivery: Delivery
    status: int = 0
    detail: str = ""
    commands: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Joined:
    """The console's answer to a join: the node this host now is, its credential, and the reporting cadence."""

    node: str
    credential: str
    sample_seconds: float
    heartbeat_seconds: float


def delivery_for(status: int) -> Delivery:
    """Return what an HTTP status means for the request that got it (see the module)."""
    if 200 <= status < 300:
        return Delivery.DELIVERED
    if status == 401:
        return Delivery.UNAUTHORIZED
    if status in _REJECTED:
        return Delivery.REJECTED
    return Delivery.FAILED


def is_loopback_host(host: str) -> bool:
    """Return whether `host` is this machine by definition: `localhost`, 127.0.0.0/8 or ::1 (never a DNS answer)."""
    name = host.lower().strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_console_url(url: str, *, allow_http: bool = False) -> str:
    """Return the console's base URL without a trailing slash; raises ConsoleUrlRefused for one never to use.

    https:// is always accepted; http:// only for a loopback host or with
    `allow_http` (the operator's explicit choice: the credential then
    crosses the network in the clear).
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConsoleUrlRefused(f"{url!r} is not a console URL: use https://console.example.com")
    if parts.scheme == "http" and not allow_http and not is_loopback_host(parts.hostname):
        raise ConsoleUrlRefused(
            f"{url} is plain HTTP: the node's credential would cross the network in the clear. Use https:// "
            "(--ca-file to trust a private CA), or pass --allow-http to accept that on a trusted network."
        )
    return url.rstrip("/")


def tls_verification(ca_file: str | None) -> ssl.SSLContext | bool:
    """Return httpx's `verify`: the system's trust store, or one that also trusts `ca_file`'s CA.

    Raises RemoteAgentError when `ca_file` cannot be read as PEM certificates.
    """
    if not ca_file:
        return True
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as error:
        raise RemoteAgentError(f"cannot use the CA file {ca_file}: {error}") from None


class ConsoleClient:
    """HTTP to one console, as one node (`credential`, absent only to join); one instance per thread."""

    def __init__(
        self, console: str, *, credential: str = "", ca_file: str | None = None, timeout: httpx.Timeout | None = None
    ) -> None:
        self.console = console.rstrip("/")
        headers = {"User-Agent": f"gpucloud-agent/{AGENT_VERSION}"}
        if credential:
            headers["Authorization"] = f"Node {credential}"
        self._http = httpx.Client(
            headers=headers,
            verify=tls_verification(ca_file),
            timeout=timeout or REQUEST_TIMEOUT,
            follow_redirects=False,
        )

    def join(self, token: str, *, hostname: str) -> Joined:
        """Trade the one-time join `token` for this host's node and credential; raises JoinRefused."""
        body = {"token": token, "hostname": hostname, "agent_version": AGENT_VERSION}
        try:
            response = self._http.post(self.console + JOIN_PATH, json=body)
        except httpx.HTTPError as error:
            raise JoinRefused(f"could not reach the console at {self.console}: {error}") from error
        if response.status_code != 201:
            raise JoinRefused(f"the console refused to join (HTTP {response.status_code}): {_detail(response)}")
        return _joined(response)

    def post_reports(self, messages: list[dict[str, Any]]) -> Reply:
        """Post `messages` as one batch; return what became of it."""
        try:
            response = self._http.post(self.console + REPORTS_PATH, json={"messages": messages})
        except httpx.HTTPError as error:
            return Reply(Delivery.FAILED, detail=f"{type(error).__name__}: {error}")
        return Reply(delivery_for(response.status_code), response.status_code, response.text[:2000])

    def poll_commands(self, wait: int = POLL_WAIT_SECONDS, acks: Sequence[str] = ()) -> Reply:
        """Wait up to `wait` seconds for work; return the commands (in `Reply.commands`, empty when none came).

        `acks` names the commands the previous poll brought: the console hands any other it gave out again.
        """
        params: dict[str, Any] = {"wait": wait}
        if acks:
            params["ack"] = ",".join(acks)
        try:
            response = self._http.get(self.console + COMMANDS_PATH, params=params, timeout=POLL_TIMEOUT)
        except httpx.HTTPError as error:
            return Reply(Delivery.FAILED, detail=f"{type(error).__name__}: {error}")
        delivery = delivery_for(response.status_code)
        if delivery is not Delivery.DELIVERED:
            return Reply(delivery, response.status_code, response.text[:2000])
        try:
            commands = response.json()["commands"]
        except (ValueError, KeyError, TypeError) as error:
            return Reply(Delivery.FAILED, response.status_code, f"not a list of commands: {error}")
        return Reply(delivery, response.status_code, commands=[c for c in commands if isinstance(c, dict)])

    def close(self) -> None:
        self._http.close()


def _detail(response: httpx.Response) -> str:
    """Return the console's `detail` of an error answer, or the start of its body."""
    try:
        body = response.json()
        # The console's error format is {"error": {"code", "message"}}; `detail` is DRF's own.
        return str(body["error"]["message"] if "error" in body else body["detail"])
    except (ValueError, KeyError, TypeError):
        return response.text[:500] or response.reason_phrase


def _joined(response: httpx.Response) -> Joined:
    try:
        body = response.json()
        return Joined(
            node=str(body["node"]),
            credential=str(body["credential"]),
            sample_seconds=float(body["sample_seconds"]),
            heartbeat_seconds=float(body["heartbeat_seconds"]),
        )
    except (ValueError, KeyError, TypeError) as error:
        raise JoinRefused(f"the console's answer to the join is not what an agent expects: {error}") from error
