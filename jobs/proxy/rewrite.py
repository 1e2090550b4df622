"""What the proxy changes on the way: headers and URL up, headers, bodies and frames down.

Upstream, credentials (the console's session and CSRF cookies, should a
browser send them, the notebook origin's own cookie, any `Authorization`)
and hop-by-hop headers are dropped, and the notebook's session token is
added: the notebook's owner never sees a credential of whoever opens it.
Downstream, only Jupyter's XSRF cookie passes, every occurrence of the
session secret is masked (`SecretMask`): the secret never reaches the
browser; `Service-Worker-Allowed` is dropped (no service worker of a
notebook claims a scope wider than its notebook's path) and a few
hardening headers are added where the upstream set none.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from django.conf import settings

from common.asgitypes import Scope
from jobs.selectors import ProxyTarget

_HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer"}
    | {b"transfer-encoding", b"upgrade"}
)
# Set by the proxy itself, or by the WebSocket client library during its own handshake.
_REPLACED = frozenset({b"host", b"authorization", b"cookie", b"origin", b"accept-encoding"})
# Jupyter's XSRF cookie is harmless to pass on; its login cookie is a credential the browser must not hold.
_PASSED_COOKIES = frozenset({"_xsrf"})


class SecretMask:
    """Replaces a secret with asterisks of the same length in a stream of chunks, also across chunk boundaries.

    Only a chunk's tail that could begin the secret is held back until the
    next chunk (usually nothing), so streamed responses are not delayed.
    """

    def __init__(self, secret: str) -> None:
        self.secret = secret.encode()
        self.masked = b"*" * len(self.secret)
        self._held = b""

    def replace(self, data: bytes) -> bytes:
        """Return `data` (one whole message) with every occurrence of the secret masked."""
        return data.replace(self.secret, self.masked) if self.secret else data

    def feed(self, chunk: bytes) -> bytes:
        """Return what of the stream so far can be released, masked."""
        data = self.replace(self._held + chunk)
        held = self._partial_suffix(data)
        self._held = data[len(data) - held :] if held else b""
        return data[: len(data) - held]

    def flush(self) -> bytes:
        """Return what is still held back at the end of the stream."""
        held, self._held = self._held, b""
        return held

    def _partial_suffix(self, data: bytes) -> int:
        """Return the length of the longest tail of `data` that begins the secret (0 when none does)."""
        if not self.secret:
            return 0
        # Runs on every chunk of a download: a C-level search for the secret's first byte in the
        # last len(secret) - 1 bytes usually finds none, instead of one endswith per possible length.
        # A whole secret cannot start there: `data` is already masked.
        first = self.secret[0]
        at = data.find(first, max(len(data) - len(self.secret) + 1, 0))
        while at != -1:
            if self.secret.startswith(data[at:]):
                return len(data) - at
            at = data.find(first, at + 1)
        return 0


def _dropped(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """Return the hop-by-hop header names: the fixed ones and those the Connection header lists."""
    listed = {
        name.strip().lower() for key, value in headers if key.lower() == b"connection" for name in value.split(b",")
    }
    return _HOP_BY_HOP | listed


def _console_cookies() -> frozenset[str]:
    # On one host (ports apart, as `gpucloud up` serves) a browser sends the console's cookies to the
    # notebook origin too: cookies are not kept apart by port.
    return frozenset({settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME, settings.NOTEBOOK_COOKIE_NAME})


def _without_console_cookies(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """Return the request's cookies, minus the console's session and CSRF cookies, as one Cookie header value."""
    console = _console_cookies()
    kept = [
        pair.strip()
        for key, value in headers
        if key.lower() == b"cookie"
        for pair in value.decode("latin-1").split(";")
        if pair.strip() and pair.split("=", 1)[0].strip() not in console
    ]
    return "; ".join(kept)


def _origin(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    return f"{parts.scheme}://{parts.netloc}"


def upstream_headers(scope: Scope, target: ProxyTarget, *, websocket: bool) -> list[tuple[str, str]]:
    """Return the headers to send upstream: the client's, minus what the console owns, plus the session token."""
    headers: list[tuple[bytes, bytes]] = scope.get("headers") or []
    csrf_header = settings.CSRF_HEADER_NAME.removeprefix("HTTP_").replace("_", "-").lower().encode()
    dropped = _dropped(headers) | _REPLACED | {csrf_header}
    kept = [
        (key.decode("latin-1"), value.decode("latin-1"))
        for key, value in headers
        if key.lower() not in dropped and not (websocket and key.lower().startswith(b"sec-websocket-"))
    ]
    cookies = _without_console_cookies(headers)
    if cookies:
        kept.append(("cookie", cookies))
    kept.append(("authorization", f"token {target.secret}"))
    if not websocket:  # the WebSocket client sets Origin itself, from the `origin` argument
        kept += [("origin", _origin(target.endpoint)), ("accept-encoding", "identity")]
    return kept


def _set_cookie_passes(value: bytes) -> bool:
    name = value.split(b"=", 1)[0].strip().decode("latin-1")
    return name in _PASSED_COOKIES and name not in _console_cookies()


# Added to every notebook response that does not set them itself; none of them stops JupyterLab working.
_HARDENING = (
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
)


def downstream_headers(headers: list[tuple[bytes, bytes]], mask: SecretMask) -> list[tuple[bytes, bytes]]:
    """Return the upstream's response headers fit for the browser: no hop-by-hop, no credentials, secret masked.

    `Service-Worker-Allowed` never passes, and the hardening headers are added where the upstream set none.
    """
    dropped = _dropped(headers) | {b"service-worker-allowed"}
    kept = [
        (key.lower(), mask.replace(value))
        for key, value in headers
        if key.lower() not in dropped and (key.lower() != b"set-cookie" or _set_cookie_passes(value))
    ]
    present = {key for key, _ in kept}
    return kept + [(key, value) for key, value in _HARDENING if key not in present]


def upstream_url(endpoint: str, scope: Scope, *, websocket: bool = False) -> str:
    """Return the upstream URL of the request: the same raw path and query on `endpoint`."""
    path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
    query = scope.get("query_string", b"").decode("latin-1")
    base = endpoint.rstrip("/")
    if websocket:
        base = "ws" + base.removeprefix("http")
    return f"{base}{path}?{query}" if query else f"{base}{path}"
