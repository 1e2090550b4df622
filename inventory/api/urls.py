"""Routes of the inventory API."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from inventory.api import views

platform = SimpleRouter(trailing_slash=True)
platform.register("node-pools", views.NodePoolEndpoint, basename="node-pool")
