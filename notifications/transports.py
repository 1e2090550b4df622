"""The two ways a delivery travels: e-mail through Django's mail settings, and signed webhook POSTs.

A transport takes an `Outbound` (everything it needs, read before any
network call) and returns an `Outcome`; it never touches the database, so
deliveries are sent outside any transaction and in threads. Every network
call has a timeout. A `permanent` outcome is not retried.
"""

from __future__ import annotations

import http.client
import json
import smtplib
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any, Protocol

from django.conf import settings
from django.core.mail import EmailMessage, get_connection

from notifications import guard, signing
from notifications.choices import Channel

USER_AGENT = "gpucloud-webhooks/1"
# Of a failed answer's body, this much is kept as the error: enough to read what the receiver said.
ERROR_BODY_BYTES = 500
MAX_ERROR_LENGTH = 1000


@dataclass(frozen=True)
class Outbound:
    """One delivery as a transport sends it."""

    delivery_id: int
    channel: str
    address: str
    event_id: str
    kind: str
    subject: str
    text: str
    body: bytes  # the webhook's JSON body (empty for e-mail)
    secret: str  # the endpoint's signing secret (empty for e-mail)


@dataclass(frozen=True)
class Outcome:
    """How one attempt went: `ok`, else the HTTP status (if any) and the error; `permanent` ends the retries."""

    ok: bool
    status: int | None = None
    error: str = ""
    permanent: bool = False


class Transport(Protocol):
    def send(self, outbound: Outbound) -> Outcome:
        """Send `outbound` once; return how it went. Never raises for network or receiver failures."""
        ...


def _error(text: str) -> str:
    return text[:MAX_ERROR_LENGTH]


class EmailTransport:
    """Plain-text e-mail through Django's mail backend (EMAIL_* settings; EMAIL_TIMEOUT bounds every SMTP call)."""

    def send(self, outbound: Outbound) -> Outcome:
        message = EmailMessage(
            subject=outbound.subject,
            body=outbound.text,
            to=[outbound.address],
            headers={signing.EVENT_ID_HEADER: outbound.event_id, signing.EVENT_KIND_HEADER: outbound.kind},
            connection=get_connection(timeout=settings.EMAIL_TIMEOUT),
        )
        try:
            sent = message.send(fail_silently=False)
        except smtplib.SMTPRecipientsRefused as error:
            return Outcome(
                ok=False, error=_error(f"The mail server refused the address: {error.recipients}"), permanent=True
            )
        except (smtplib.SMTPException, OSError) as error:
            return Outcome(ok=False, error=_error(f"{type(error).__name__}: {error}"))
        return Outcome(ok=True) if sent else Outcome(ok=False, error="The mail backend sent nothing.")


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection to a checked address, whatever the host name resolves to now."""

    def __init__(self, target: guard.Target, timeout: float) -> None:
        super().__init__(target.host, target.port, timeout=timeout)
        self._address = target.address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """An HTTPS connection to a checked address, verifying the certificate against the URL's host name."""

    def __init__(self, target: guard.Target, timeout: float) -> None:
        self._tls = ssl.create_default_context()
        super().__init__(target.host, target.port, timeout=timeout, context=self._tls)
        self._address = target.address

    def connect(self) -> None:
        raw = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(raw, server_hostname=self.host)


def webhook_headers(outbound: Outbound, *, timestamp: int) -> dict[str, str]:
    """Return the headers of a webhook POST of `outbound` signed at `timestamp`."""
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        signing.EVENT_KIND_HEADER: outbound.kind,
        signing.EVENT_ID_HEADER: outbound.event_id,
        signing.DELIVERY_HEADER: str(outbound.delivery_id),
        signing.TIMESTAMP_HEADER: str(timestamp),
        signing.SIGNATURE_HEADER: signing.signature(outbound.secret, timestamp, outbound.body),
    }


class WebhookTransport:
    """A signed JSON POST to the endpoint's URL; any 2xx answer is success. Redirects are not followed."""

    def send(self, outbound: Outbound) -> Outcome:
        timeout = float(settings.NOTIFICATIONS_WEBHOOK_TIMEOUT_SECONDS)
        try:
            target = guard.resolve(outbound.address, allow_private=settings.NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE)
        except guard.AddressRefused as refused:
            return Outcome(ok=False, error=_error(str(refused)), permanent=True)
        except OSError as error:
            return Outcome(ok=False, error=_error(f"Could not resolve the host: {error}"))
        kind = _PinnedHTTPSConnection if target.scheme == "https" else _PinnedHTTPConnection
        connection = kind(target, timeout)
        try:
            connection.request(
                "POST", target.path, body=outbound.body, headers=webhook_headers(outbound, timestamp=int(time.time()))
            )
            response = connection.getresponse()
            answer = response.read(ERROR_BODY_BYTES)
        except (OSError, http.client.HTTPException) as error:
            return Outcome(ok=False, error=_error(f"{type(error).__name__}: {error}"))
        finally:
            connection.close()
        if 200 <= response.status < 300:
            return Outcome(ok=True, status=response.status)
        said = answer.decode("utf-8", "replace").strip()
        return Outcome(
            ok=False, status=response.status, error=_error(f"HTTP {response.status}" + (f": {said}" if said else ""))
        )


TRANSPORTS: dict[str, Transport] = {Channel.EMAIL: EmailTransport(), Channel.WEBHOOK: WebhookTransport()}


def webhook_body(
    *, event_id: str, kind: str, created_at: str, tenant: str | None, subject: str, text: str, data: Any
) -> bytes:
    """Return the JSON body every endpoint receives for one notification (the same bytes on every retry)."""
    document = {
        "id": event_id,
        "type": kind,
        "created_at": created_at,
        "tenant": tenant,
        "summary": subject,
        "text": text,
        "data": data,
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
