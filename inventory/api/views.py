"""API endpoints of the inventory app."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from inventory import selectors, services
from inventory.api import serializers as s
from inventory.models import Gpu, Node, NodeEvent, NodePool
from inventory.services import agents
from tenants.api.base import PlatformViewSet
from tenants.choices import Role


class NodePoolEndpoint(mixins.ListModelMixin, mixins.RetrieveModelMixin, PlatformViewSet):
    """Node pools: operators manage them; tenant users see shared pools and their own dedicated ones."""

    serializer_class = s.NodePoolSerializer
    lookup_field = "name"
    ordering_fields = ["name", "created_at"]
    search_fields = ["name"]

    def scoped_queryset(self) -> QuerySet[NodePool]:
        return selectors.pools_visible_to(self.actor)

    def get_serializer(self, *args: Any, **kwargs: Any) -> Any:
        # Capacity of every pool being rendered, in one query for the whole page.
        serializer = super().get_serializer(*args, **kwargs)
        if args and args[0] is not None:
            pools = [args[0]] if isinstance(args[0], NodePool) else list(args[0])
            serializer.context["capacity"] = selectors.pool_capacity([pool.pk for pool in pools])
        return serializer

    @extend_schema(request=s.NodePoolCreateSerializer, responses={201: s.NodePoolSerializer})
    def create(self, request: Request) -> Response:
        data = self.validated_input(s.NodePoolCreateSerializer, rules=services.pool_errors)
        return self.respond(services.create_node_pool(actor=self.actor, **data), status.HTTP_201_CREATED)

    @extend_schema(request=s.NodePoolUpdateSerializer, responses=s.NodePoolSerializer)
    def partial_update(self, request: Request, name: str) -> Response:
        data = self.validated_input(s.NodePoolUpdateSerializer, partial=True)
        return self.respond(services.update_node_pool(actor=self.actor, pool=self.get_object(), **data))

    def destroy(self, request: Request, name: str) -> Response:
        services.delete_node_pool(actor=self.actor, pool=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class NodeEndpoint(mixins.ListModelMixin, mixins.RetrieveModelMixin, PlatformViewSet):
    """Nodes and their lifecycle: operators only. Illegal transitions answer 409 with the current state."""

    serializer_class = s.NodeSerializer
    lookup_field = "name"
    lookup_value_regex = r"[a-z0-9.-]+"
    read_role = Role.OPERATOR
    filterset_fields = ["state", "runtime", "kind", "pool__name"]
    ordering_fields = ["name", "state", "last_heartbeat_at", "created_at"]
    search_fields = ["name", "address"]

    def scoped_queryset(self) -> QuerySet[Node]:
        return selectors.nodes_for_operators()

    @extend_schema(request=s.NodeCreateSerializer, responses={201: s.NodeSerializer})
    def create(self, request: Request) -> Response:
        data = self.validated_input(s.NodeCreateSerializer, rules=services.registration_errors)
        node = services.register_node(actor=self.actor, **data)
        return self.respond(self._fresh(node), status.HTTP_201_CREATED)

    @extend_schema(request=s.NodeUpdateSerializer, responses=s.NodeSerializer)
    def partial_update(self, request: Request, name: str) -> Response:
        data = self.validated_input(s.NodeUpdateSerializer, partial=True)
        return self.respond(self._fresh(services.update_node(actor=self.actor, node=self.get_object(), **data)))

    def _fresh(self, node: Node) -> Node:
        return self.get_queryset().get(pk=node.pk)

    def _act(self, service: Callable[..., Node], *, with_reason: bool = True) -> Response:
        extra = self.validated_input(s.ReasonSerializer) if with_reason else {}
        return self.respond(self._fresh(service(actor=self.actor, node=self.get_object(), **extra)))

    @extend_schema(request=None, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"])
    def provision(self, request: Request, name: str) -> Response:
        """Start provisioning: probe runtime and GPUs through the agent, run the health check."""
        return self._act(services.provision_node, with_reason=False)

    @extend_schema(request=s.ReasonSerializer, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"])
    def cordon(self, request: Request, name: str) -> Response:
        """Stop new placements on the node; `reason` required."""
        return self._act(services.cordon_node)

    @extend_schema(request=None, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"])
    def uncordon(self, request: Request, name: str) -> Response:
        """Return a cordoned, draining or maintenance node to service."""
        return self._act(services.uncordon_node, with_reason=False)

    @extend_schema(request=s.ReasonSerializer, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, name: str) -> Response:
        """Stop placements; the node reaches maintenance once nothing holds its GPUs. `reason` required."""
        return self._act(services.drain_node)

    @extend_schema(request=s.ReasonSerializer, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"])
    def maintenance(self, request: Request, name: str) -> Response:
        """Enter maintenance (through draining) when nothing holds the node's GPUs; `reason` required."""
        return self._act(services.enter_maintenance)

    @extend_schema(request=s.JoinTokenRequestSerializer, responses={201: s.JoinTokenSerializer})
    @action(detail=True, methods=["post"], url_path="join-token")
    def join_token(self, request: Request, name: str) -> Response:
        """Issue a one-time join token for a fresh host (voids earlier unused ones); shown once."""
        data = self.validated_input(s.JoinTokenRequestSerializer)
        node = self.get_object()
        issued = agents.issue_join_token(actor=self.actor, node=node, ttl=timedelta(seconds=data["expires_in"]))
        body = {
            "node": node.name,
            "token": issued.secret,
            "expires_at": issued.row.expires_at,
            "command": agents.join_command(request.build_absolute_uri("/").rstrip("/"), issued.secret),
        }
        return Response(s.JoinTokenSerializer(body).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.ReasonSerializer, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"], url_path="revoke-agent")
    def revoke_agent(self, request: Request, name: str) -> Response:
        """Cut the node's agent off now: its credential stops working at its next request."""
        return self._act(agents.revoke_node_credentials)

    @extend_schema(request=s.ReasonSerializer, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"])
    def retire(self, request: Request, name: str) -> Response:
        """Take the node out of the cloud for good."""
        return self._act(services.retire_node)


class NodeGpuEndpoint(mixins.ListModelMixin, PlatformViewSet):
    """The GPUs of one node, with health and last sample: operators only."""

    serializer_class = s.GpuSerializer
    read_role = Role.OPERATOR
    pagination_class = None

    def scoped_queryset(self) -> QuerySet[Gpu]:
        node = get_object_or_404(Node, name=self.kwargs["node"])
        return selectors.gpus_for_operators().filter(node=node)


class NodeEventEndpoint(mixins.ListModelMixin, PlatformViewSet):
    """A node's state history and GPU events, newest first: operators only."""

    serializer_class = s.NodeEventSerializer
    read_role = Role.OPERATOR
    filterset_fields = ["kind"]

    def scoped_queryset(self) -> QuerySet[NodeEvent]:
        return selectors.node_events(get_object_or_404(Node, name=self.kwargs["node"]))


class GpuEndpoint(mixins.ListModelMixin, mixins.RetrieveModelMixin, PlatformViewSet):
    """Every GPU in the cloud with health and last utilization: operators only."""

    serializer_class = s.GpuSerializer
    read_role = Role.OPERATOR
    lookup_field = "uuid"
    lookup_value_regex = r"[A-Za-z0-9-]+"
    filterset_fields = ["health", "model", "node__name", "node__pool__name"]
    ordering_fields = ["uuid", "health", "utilization"]

    def scoped_queryset(self) -> QuerySet[Gpu]:
        return selectors.gpus_for_operators()
