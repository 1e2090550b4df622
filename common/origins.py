"""Web origins (scheme, host, port) compared whole, and the notebook origin's pattern.

Apps that users serve live on an origin of their own, never the console's
(docs/security.md). `NOTEBOOK_ORIGIN` names it: one apps host
(`https://apps.example.org`, or `http://127.0.0.1:8001` on one machine) or a
host per notebook (`https://nb-{id}.apps.example.org`). Two origins are the
same only when scheme, host and port all are (a browser's rule): a host
check alone would let `http://console:8001` pass for `https://console`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_ID = "{id}"
# A host name (dot-separated DNS labels) or an IP literal.
_HOST = re.compile(r"^(\[[0-9a-f:.]+\]|[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*)$")


@dataclass(frozen=True)
class Origin:
    """A web origin: scheme (http or https), lower-case host (IPv6 in brackets) and port (the default filled in)."""

    scheme: str
    host: str
    port: int

    def __str__(self) -> str:
        default = self.port == _DEFAULT_PORTS[self.scheme]
        return f"{self.scheme}://{self.host}" if default else f"{self.scheme}://{self.host}:{self.port}"

    @property
    def netloc(self) -> str:
        """Return host[:port] as a browser sends it in the Host header (no port when it is the default)."""
        return str(self).split("://", 1)[1]


def parse_origin(value: str) -> Origin | None:
    """Return the origin `value` names (`scheme://host[:port]`, nothing after), or None when it names none."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/") or parts.query:
        return None
    if parts.username is not None or parts.fragment:
        return None
    host = parts.hostname.lower()
    host = f"[{host}]" if ":" in host else host
    return Origin(scheme, host, port or _DEFAULT_PORTS[scheme])


def same_origin(value: str, expected: Origin) -> bool:
    """Return True when the Origin header value `value` is `expected`: scheme, host and port alike."""
    found = parse_origin(value)
    return found is not None and found == expected


def host_of(header: str, scheme: str) -> tuple[str, int] | None:
    """Return (host, port) of a Host header value, the scheme's default port filled in; None when malformed."""
    found = parse_origin(f"{scheme}://{header}")
    return None if found is None else (found.host, found.port)


@dataclass(frozen=True)
class OriginPattern:
    """Where notebooks are served: `host` holds `{id}` when each notebook has a host of its own."""

    scheme: str
    host: str
    port: int

    @property
    def per_notebook(self) -> bool:
        """Return whether each notebook has an origin of its own (a wildcard apps domain)."""
        return _ID in self.host

    def origin_of(self, workload_id: int) -> Origin:
        """Return the origin that serves notebook `workload_id`."""
        return Origin(self.scheme, self.host.replace(_ID, str(workload_id)), self.port)

    def serves(self, host_header: str, workload_id: int | None = None) -> bool:
        """Return whether a request with this Host header is for this origin (and, per notebook, for `workload_id`).

        With `{id}` and no `workload_id`, any notebook's host matches.
        """
        found = host_of(host_header, self.scheme)
        if found is None or found[1] != self.port:
            return False
        if not self.per_notebook:
            return found[0] == self.host
        if workload_id is not None:
            return found[0] == self.origin_of(workload_id).host
        head, tail = self.host.split(_ID, 1)
        return re.fullmatch(re.escape(head) + r"[1-9][0-9]{0,17}" + re.escape(tail), found[0]) is not None

    def __str__(self) -> str:
        return str(Origin(self.scheme, self.host, self.port))


def parse_origin_pattern(value: str) -> OriginPattern | None:
    """Return the pattern `value` names (an origin whose host may hold one `{id}`), or None when it names none."""
    text = value.strip()
    if text.count(_ID) > 1:
        return None
    found = parse_origin(text.replace(_ID, "0" * 5))  # urlsplit reads `{id}` as part of the host
    if found is None or found.scheme not in ("http", "https"):
        return None
    host = urlsplit(text).hostname or ""
    host = f"[{host}]" if ":" in host else host
    # `{id}` only in the leftmost label: a wildcard certificate and DNS record cover exactly one label.
    if not _HOST.match(host.lower().replace(_ID, "1")) or (_ID in host and "." in host.split(_ID, 1)[0]):
        return None
    return OriginPattern(found.scheme, host.lower(), found.port)
