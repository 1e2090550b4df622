"""API endpoints of the inventory app."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.request import Request
from rest_framework.response import Response

from inventory import selectors, services
from inventory.api import serializers as s
from inventory.models import NodePool
from tenants.api.base import PlatformViewSet


class NodePoolEndpoint(mixins.ListModelMixin, mixins.RetrieveModelMixin, PlatformViewSet):
    """Node pools: operators manage them; tenant users see shared pools and their own dedicated ones."""

    serializer_class = s.NodePoolSerializer
    lookup_field = "name"
    ordering_fields = ["name", "created_at"]
    search_fields = ["name"]

    def scoped_queryset(self) -> QuerySet[NodePool]:
        return selectors.pools_visible_to(self.actor)

    @extend_schema(request=s.NodePoolCreateSerializer, responses={201: s.NodePoolSerializer})
    def create(self, request: Request) -> Response:
        data = self.validated_input(s.NodePoolCreateSerializer)
        return self.respond(services.create_node_pool(actor=self.actor, **data), status.HTTP_201_CREATED)

    @extend_schema(request=s.NodePoolUpdateSerializer, responses=s.NodePoolSerializer)
    def partial_update(self, request: Request, name: str) -> Response:
        data = self.validated_input(s.NodePoolUpdateSerializer, partial=True)
        return self.respond(services.update_node_pool(actor=self.actor, pool=self.get_object(), **data))

    def destroy(self, request: Request, name: str) -> Response:
        services.delete_node_pool(actor=self.actor, pool=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
