"""How webhook deliveries are signed, and how a receiver checks them (docs/notifications.md shows both).

The signed message is `<timestamp>.<body>`: the Unix time in
`X-Gpucloud-Timestamp`, a dot, and the raw request body, as Stripe signs
its webhooks. The signature is its HMAC-SHA256 under the endpoint's secret,
sent hex-encoded as `X-Gpucloud-Signature: sha256=<hex>`, as GitHub names
its own. Signing the timestamp lets a receiver refuse a replayed request
that is older than it tolerates.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SIGNATURE_HEADER = "X-Gpucloud-Signature"
TIMESTAMP_HEADER = "X-Gpucloud-Timestamp"
EVENT_ID_HEADER = "X-Gpucloud-Event-Id"
EVENT_KIND_HEADER = "X-Gpucloud-Event"
DELIVERY_HEADER = "X-Gpucloud-Delivery"
SECRET_PREFIX = "whsec_"  # noqa: S105 -- the secrets' visible prefix, not a secret
# A receiver should refuse signatures older than this (seconds); `verify` does by default.
DEFAULT_TOLERANCE = 300


def new_secret() -> str:
    """Return a fresh endpoint secret: `whsec_` and 32 random bytes, URL-safe."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """Return the `X-Gpucloud-Signature` value for `body` sent at `timestamp`: `sha256=<hex HMAC>`."""
    message = str(timestamp).encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def verify(
    secret: str, *, header: str, timestamp: str, body: bytes, now: float, tolerance: int = DEFAULT_TOLERANCE
) -> bool:
    """Return whether `header` signs `body` at `timestamp` under `secret`, within `tolerance` seconds of `now`.

    What a receiver does: recompute the signature from the raw body and the
    timestamp header, compare in constant time, and refuse old timestamps.
    """
    try:
        sent = int(timestamp)
    except ValueError:
        return False
    if abs(now - sent) > tolerance:
        return False
    return hmac.compare_digest(signature(secret, sent, body), header)
