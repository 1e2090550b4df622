"""Routes of the inventory API: `platform` under /api/v1/, `tenant` (volumes) under /api/v1/tenants/<tenant>/."""

from __future__ import annotations

from typing import Any

from rest_framework.routers import Route, SimpleRouter

from inventory.api import views, volumes


def _collection_route_with_delete() -> list[Any]:
    """Return SimpleRouter's routes with DELETE on a collection mapped to the viewset's `remove`, if it has one.

    Files are named by `?path=`, not by a key in the URL: `DELETE volumes/<id>/files/?path=x` removes one.
    """
    collection, *rest = SimpleRouter.routes
    assert isinstance(collection, Route)
    return [collection._replace(mapping={**collection.mapping, "delete": "remove"}), *rest]


class _Router(SimpleRouter):
    routes = _collection_route_with_delete()


VOLUME = r"volumes/(?P<volume>[0-9]{1,18})"

tenant = _Router(trailing_slash=True)
tenant.register("volumes", volumes.VolumeEndpoint, basename="volume")
tenant.register(f"{VOLUME}/shares", volumes.VolumeShareEndpoint, basename="volume-share")
tenant.register(f"{VOLUME}/files", volumes.VolumeFileEndpoint, basename="volume-file")


platform = SimpleRouter(trailing_slash=True)
platform.register("node-pools", views.NodePoolEndpoint, basename="node-pool")
platform.register("nodes", views.NodeEndpoint, basename="node")
platform.register(r"nodes/(?P<node>[a-z0-9.-]+)/gpus", views.NodeGpuEndpoint, basename="node-gpu")
platform.register(r"nodes/(?P<node>[a-z0-9.-]+)/events", views.NodeEventEndpoint, basename="node-event")
platform.register("gpus", views.GpuEndpoint, basename="gpu")
platform.register("storage-backends", volumes.StorageBackendEndpoint, basename="storage-backend")
