"""Which registries an image reference may name: never this machine's or a cloud's metadata service.

An image is pulled by the Docker engine of the node that runs it. A reference
naming `127.0.0.1:2375/...`, `localhost/...` or `169.254.169.254/...` makes
that engine connect, with the node's own network identity, to a service that
listens only for the node itself (a local registry, the engine's API, a
cloud's instance metadata with its credentials). Such a reference is refused
at submission (`blocked_registry` on `image`) unless an operator allows that
registry by name in `IMAGE_REGISTRIES_ALLOWED` (a registry served on the
node's loopback on purpose, e.g. for tests).

Only the reference's text is judged: a DNS name that resolves to such an
address is the registry's operator's to answer for (the agent's egress rules,
`inventory.drivers.egress`, keep workload containers themselves off them).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Collection

from django.conf import settings

from common.errors import invalid

RULE_BLOCKED_REGISTRY = "blocked_registry"

BLOCKED_NAMES = frozenset(
    {
        "localhost",
        "localhost.localdomain",
        "ip6-localhost",
        "ip6-loopback",
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.azure.com",
        "metadata.tencentyun.com",
        "100-100-100-200.aliyun.com",
    }
)
"""Host names that always mean this machine or a cloud's metadata service."""

_METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("100.100.100.200", "fd00:ec2::254", "169.254.169.254", "169.254.170.2")
)


def registry_of(image: str) -> str | None:
    """Return the registry part of an image reference (`host[:port]`, lower case), or None for Docker Hub's.

    As the engine reads a reference: the first path component is a registry
    when it holds a `.` or a `:`, or is `localhost`.
    """
    first, slash, _ = image.partition("/")
    if not slash:
        return None
    if "." in first or ":" in first or first.lower() == "localhost":
        return first.lower()
    return None


def host_of(registry: str) -> str:
    """Return the host of `host[:port]` or `[v6]:port`, without brackets, port and trailing dot."""
    if registry.startswith("["):
        return registry[1:].partition("]")[0]
    host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
    return host.rstrip(".")


def is_blocked_host(host: str) -> bool:
    """Return whether `host` names loopback, link-local, an unspecified address or a metadata service.

    IPv4 is read as the C resolver reads it (`127.1`, `0x7f.0.0.1` and
    `2130706433` are all 127.0.0.1), so no spelling slips past.
    """
    name = host.lower().rstrip(".")
    if name in BLOCKED_NAMES or name.endswith(".localhost"):
        return True
    address = _address(name)
    if address is None:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_link_local or address.is_unspecified or address in _METADATA_ADDRESSES


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name.partition("%")[0])
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(name))
    except OSError:
        return None


def check_registry(image: str, allowed: Collection[str] | None = None) -> None:
    """Raise ValidationError on `image` (rule `blocked_registry`) when it names a blocked registry not allowed.

    `allowed` (default: the setting `IMAGE_REGISTRIES_ALLOWED`) lists
    registries as `host` (any port) or `host:port`, compared in lower case.
    """
    registry = registry_of(image)
    if registry is None or not is_blocked_host(host_of(registry)):
        return
    entries = {entry.lower() for entry in (settings.IMAGE_REGISTRIES_ALLOWED if allowed is None else allowed)}
    if registry in entries or host_of(registry) in entries:
        return
    raise invalid(
        "image",
        RULE_BLOCKED_REGISTRY,
        f"The registry {registry} is this machine's or a metadata service's; an operator must allow it "
        "(IMAGE_REGISTRIES_ALLOWED).",
    )
