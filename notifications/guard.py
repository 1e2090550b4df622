"""Where webhooks may go: http or https only, never link-local or cloud-metadata addresses, and private
networks (loopback included) only where the deployment allows them (NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE).

URLs are checked twice. When an endpoint is saved, its form: scheme, host,
no credentials, and a literal address by the rules below. When a delivery
is sent, the host name is resolved and every address it resolves to is
checked; the request then goes to the checked address itself, so a name
that resolves differently a moment later (DNS rebinding) cannot redirect it.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

SCHEMES = ("http", "https")
MAX_URL_LENGTH = 2000
# Instance-metadata services outside 169.254.0.0/16 (which is link-local, refused anyway): AWS's IPv6 one
# and Alibaba Cloud's.
METADATA_ADDRESSES = frozenset({ipaddress.ip_address("fd00:ec2::254"), ipaddress.ip_address("100.100.100.200")})
METADATA_NAMES = frozenset({"metadata", "metadata.google.internal", "metadata.goog", "instance-data"})
LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


class AddressRefused(Exception):
    """A webhook's host resolves to an address webhooks may not reach; the message says which and why."""


@dataclass(frozen=True)
class Target:
    """Where a webhook request goes: the URL's parts, and the checked address to connect to."""

    scheme: str
    host: str
    port: int
    path: str
    address: str


def _unmapped(address: IpAddress) -> IpAddress:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def refusal(address: IpAddress, *, allow_private: bool) -> str | None:
    """Return why a webhook may not go to `address`, or None when it may."""
    address = _unmapped(address)
    if address.is_link_local or address in METADATA_ADDRESSES:
        return f"{address} is a link-local or cloud metadata address"
    if address.is_multicast or address.is_unspecified:
        return f"{address} is not a unicast address"
    private = address.is_loopback or address.is_private or not address.is_global
    if address.is_reserved and not address.is_loopback:
        return f"{address} is a reserved address"
    if private and not allow_private:
        return (
            f"{address} is a private, loopback or otherwise non-public address "
            "(NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE allows private networks)"
        )
    return None


def _literal(host: str) -> IpAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def url_problem(url: str, *, allow_private: bool) -> str | None:
    """Return what is wrong with `url` as a webhook URL, in words for people, or None when it is acceptable.

    Checks the form only (no name is resolved): scheme, host, no user name
    or password, a valid port, and a literal address or a well-known local
    name by `refusal`'s rules.
    """
    if len(url) > MAX_URL_LENGTH:
        return f"Keep the URL under {MAX_URL_LENGTH} characters."
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return "Enter a valid URL, e.g. https://hooks.example.com/gpucloud."
    if parts.scheme not in SCHEMES:
        return "Webhook URLs start with https:// or http://."
    host = (parts.hostname or "").rstrip(".")
    if not host:
        return "The URL names no host."
    if parts.username is not None or parts.password is not None:
        return "Put no user name or password in the URL: the signature proves who is calling."
    if port == 0:
        return "The URL's port must be between 1 and 65535."
    address = _literal(host)
    if address is not None:
        why = refusal(address, allow_private=allow_private)
        return f"Webhooks cannot go there: {why}." if why else None
    if host.lower() in METADATA_NAMES:
        return f"Webhooks cannot go to {host}, a cloud metadata service."
    lowered = host.lower()
    if not allow_private and (lowered in LOCAL_NAMES or lowered.endswith(".localhost")):
        return f"Webhooks cannot go to {host} (NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE allows private networks)."
    return None


def resolve(url: str, *, allow_private: bool) -> Target:
    """Return where a request to `url` goes, with the address to connect to checked by `refusal`.

    Every address the host resolves to must pass, not only the one used: an
    answer that mixes public and private addresses is refused. Raises
    AddressRefused when one does not (or the URL's form is refused), OSError
    when the name does not resolve.
    """
    problem = url_problem(url, allow_private=allow_private)
    if problem is not None:
        raise AddressRefused(problem)
    parts = urlsplit(url.strip())
    host = (parts.hostname or "").rstrip(".")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in found]
    if not addresses:
        raise OSError(f"{host} resolves to no address")
    for address in addresses:
        why = refusal(address, allow_private=allow_private)
        if why is not None:
            raise AddressRefused(f"{host} resolves to {why}.")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(scheme=parts.scheme, host=host, port=port, path=path, address=str(addresses[0]))
