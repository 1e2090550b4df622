"""Which endpoint a node may report for a replica: where the console's notebook proxy will connect.

A node reports `http://HOST:PORT` when a replica with a service port starts
(`jobs.replica_started`); the proxy, idle culling and hibernation then
connect there with the console's own network identity. GPU hosts are
untrusted peers, so an endpoint is taken only when it is on the node itself:

- HOST is the node's registered address (`Node.address`, which may be a
  Docker bridge's on the console's machine), or, for a node on the
  console's own machine only (`is_local_node`), a loopback address; never
  a loopback, link-local or metadata address otherwise, whatever the
  node's registered address says;
- PORT is one the engine may have published: 1024 to 65535 (the engine
  picks it when the container starts, so the console cannot know it
  beforehand; ports below 1024 are the host's own services);
- nothing else: `http` only, no user, path, query or fragment.

Anything else is refused and logged (`endpoint_problem` says why): the
agent gateway refuses the report (`jobs.services.agent_gateway`), and the
service that records a start keeps the replica without an endpoint
(`jobs.services.replicas`), so the proxy has nowhere to go.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from inventory.models import Node
from inventory.services.local_node import LOCAL_LABEL
from jobs.services.registries import is_blocked_host

LOWEST_PORT = 1024


def endpoint_problem(endpoint: str, node: Node, *, local: bool) -> str | None:
    """Return why `node` may not report `endpoint`, or None when the proxy may connect there.

    `local` says whether the report comes from the console's own local node
    (`is_local_node`); a report through the agent gateway never does.
    """
    if not endpoint:
        return None  # no service port: nothing for the proxy to reach
    try:
        parts = urlsplit(endpoint)
        host, port = parts.hostname, parts.port
    except ValueError:
        return "not an http://HOST:PORT endpoint"
    if parts.scheme != "http" or parts.username or parts.password or parts.path or parts.query or parts.fragment:
        return "not an http://HOST:PORT endpoint"
    if host is None or port is None:
        return "not an http://HOST:PORT endpoint"
    if not LOWEST_PORT <= port <= 65535:
        return f"port {port} is not one the engine publishes ({LOWEST_PORT} to 65535)"
    if local and _is_loopback(host):
        return None
    if is_blocked_host(host):
        # Even a node registered at 127.0.0.1 names the console's loopback, not its own, from the proxy's side.
        return f"{host} is a loopback, link-local or metadata address"
    if _on_node(host, node.address):
        return None
    return f"{host} is not node {node.name}'s registered address ({node.address or 'none'})"


def is_local_node(node: Node) -> bool:
    """Return whether `node` runs on the console's own machine: its agent speaks through no gateway credential,
    and it is labelled the local node (`gpucloud.local`) or registered at no address or a loopback one.

    An agent that reports straight to the broker already holds the console's
    Redis credentials (it is the console's own: embedded mode, or a co-located
    agent); a joined host's reports come through the gateway, which never
    takes a loopback endpoint.
    """
    if node.credentials.filter(revoked_at__isnull=True).exists():
        return False
    labels = node.labels if isinstance(node.labels, dict) else {}
    return labels.get(LOCAL_LABEL) == "true" or not node.address or _is_loopback(node.address)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _on_node(host: str, address: str) -> bool:
    """Return whether `host` (an endpoint's) is `address` (the node's registered one), IPs compared as IPs.

    No name is resolved: the runtimes build an endpoint from the IP they
    publish on (GPUCLOUD_AGENT_PUBLISH_ADDRESS), which is the address an
    operator registers for the node.
    """
    if not address:
        return False
    wanted, found = _ip(address), _ip(host)
    if wanted is None or found is None:
        return host.lower().rstrip(".") == address.lower().rstrip(".")
    return found == wanted


def _ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(value.strip("[]"))
    except ValueError:
        return None
