"""Routes of the inventory API."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from inventory.api import views

platform = SimpleRouter(trailing_slash=True)
platform.register("node-pools", views.NodePoolEndpoint, basename="node-pool")
platform.register("nodes", views.NodeEndpoint, basename="node")
platform.register(r"nodes/(?P<node>[a-z0-9.-]+)/gpus", views.NodeGpuEndpoint, basename="node-gpu")
platform.register(r"nodes/(?P<node>[a-z0-9.-]+)/events", views.NodeEventEndpoint, basename="node-event")
platform.register("gpus", views.GpuEndpoint, basename="gpu")
