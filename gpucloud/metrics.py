"""The `/metrics` endpoint's logic: who may read it, and one scrape of the fleet's and the queue's collectors.

It lives in `gpucloud`, the URL root, because a scrape joins two apps:
GPU readings (inventory) are labelled with the workload holding each GPU
(jobs), and inventory may not import jobs. `gpucloud` may import both;
`frontend` could too, but /metrics is no page of the UI and answers no
session. The collectors themselves stay with the apps that own the data
(`inventory.metrics`, `jobs.metrics`).

Access (settings METRICS_TOKEN, METRICS_ALLOWED_NETWORKS): every check that
is configured must pass; with none configured only loopback callers are
answered. Refusals are plain one-line messages, never metrics.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass

from django.conf import settings
from django.http import HttpRequest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from common import control
from common.requests import client_address
from inventory.metrics import InventoryCollector
from jobs.metrics import ActiveGpuAllocations, JobsCollector

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
LOOPBACK: tuple[IpNetwork, ...] = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))


@dataclass(frozen=True)
class Refusal:
    """Why a caller may not read /metrics: the HTTP status (401 or 403) and a one-line message."""

    status: int
    message: str


def _within(address: str, networks: tuple[IpNetwork, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # a dual-stack socket reports IPv4 callers as ::ffff:a.b.c.d
    return any(ip in network for network in networks)


def _bearer(request: HttpRequest) -> str | None:
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    return (credentials.strip() or None) if scheme.lower() == "bearer" else None


def metrics_refusal(request: HttpRequest) -> Refusal | None:
    """Return why `request` may not read /metrics, or None when it may.

    403 when the caller's address is outside METRICS_ALLOWED_NETWORKS (or,
    with neither setting, not loopback); 401 when METRICS_TOKEN is set and
    the request lacks it or sends another (compared in constant time).
    """
    token: str | None = settings.METRICS_TOKEN
    configured: list[str] = settings.METRICS_ALLOWED_NETWORKS
    if configured or not token:
        networks = tuple(ipaddress.ip_network(n, strict=False) for n in configured) if configured else LOOPBACK
        if not _within(client_address(request) or "", networks):
            setting = "METRICS_ALLOWED_NETWORKS" if configured else "METRICS_TOKEN or METRICS_ALLOWED_NETWORKS"
            return Refusal(403, f"/metrics is not open to this address; set {setting} (loopback only by default).")
    if token:
        offered = _bearer(request)
        if offered is None:
            return Refusal(401, "/metrics needs the header Authorization: Bearer <METRICS_TOKEN>.")
        if not hmac.compare_digest(offered.encode(), token.encode()):
            return Refusal(401, "The bearer token sent to /metrics is not METRICS_TOKEN.")
    return None


class QueueCollector(Collector):
    """Messages waiting on the controller's queues: control work (coalesced, so it stays small) and ingest."""

    def collect(self) -> Iterator[Metric]:
        queued = GaugeMetricFamily(
            "gpucloud_queued_tasks", "Task messages waiting in the broker, by queue (-1: broker unreachable).",
            labels=["queue"],
        )  # fmt: skip
        for queue, depth in sorted(control.queue_depths().items()):
            queued.add_metric([queue], depth)
        yield queued


def scrape_registry() -> CollectorRegistry:
    """Return a private registry holding one scrape's collectors (never the library's global default registry).

    Built per scrape so that both collectors share that scrape's one read of
    the active allocations; registering reads nothing (the collectors have
    no `describe`), collecting reads the ledger.
    """
    allocations = ActiveGpuAllocations()
    registry = CollectorRegistry()
    registry.register(InventoryCollector(holders=allocations.holders))
    registry.register(JobsCollector(allocations=allocations))
    registry.register(QueueCollector())
    return registry


def render_metrics(accept: str) -> tuple[bytes, str]:
    """Return (body, content type) of one scrape: OpenMetrics when `accept` asks for it, else text format 0.0.4."""
    encoder, content_type = choose_encoder(accept)
    return encoder(scrape_registry()), content_type
