"""Paths of the live views' WebSockets (routed in `frontend/routing.py`), as the pages hand them to their scripts.

The scripts build the full ws:// or wss:// URL from the page's own location,
so a page served behind a proxy connects back through the same host.
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

CLUSTER = "/ws/cluster/"
# Lines the log viewer asks for on its first connect, and the most it keeps in memory.
LOG_TAIL = 1000
LOG_CAP = 100_000


def workload_logs(workload_id: int) -> str:
    return f"/ws/workloads/{workload_id}/logs/"


def workload_metrics(workload_id: int) -> str:
    return f"/ws/workloads/{workload_id}/metrics/"


def node_metrics(node_name: str) -> str:
    return f"/ws/nodes/{quote(node_name, safe='')}/metrics/"


def tenant_events(tenant_slug: str, project_slug: str = "") -> str:
    """Return the path of a tenant's workload events, narrowed to one project when `project_slug` is given."""
    path = f"/ws/t/{quote(tenant_slug, safe='')}/events/"
    return f"{path}?{urlencode({'project': project_slug})}" if project_slug else path
