"""WebSocket routes of the live streams (protocol in docs/live.md); `gpucloud/asgi.py` wraps them in authentication."""

from __future__ import annotations

from django.urls import URLPattern, re_path

from frontend.consumers.cluster import ClusterConsumer
from frontend.consumers.events import EventsConsumer
from frontend.consumers.logs import LogConsumer
from frontend.consumers.metrics import NodeMetricsConsumer, WorkloadMetricsConsumer

# Ids are bounded so they always fit a database integer.
_WORKLOAD = r"(?P<workload_id>[1-9][0-9]{0,17})"

websocket_urlpatterns: list[URLPattern] = [
    re_path(rf"^ws/workloads/{_WORKLOAD}/logs/$", LogConsumer.as_asgi()),
    re_path(rf"^ws/workloads/{_WORKLOAD}/metrics/$", WorkloadMetricsConsumer.as_asgi()),
    re_path(r"^ws/nodes/(?P<name>[-a-zA-Z0-9_.]{1,63})/metrics/$", NodeMetricsConsumer.as_asgi()),
    re_path(r"^ws/t/(?P<tenant>[-a-zA-Z0-9_]{1,100})/events/$", EventsConsumer.as_asgi()),
    re_path(r"^ws/cluster/$", ClusterConsumer.as_asgi()),
]
