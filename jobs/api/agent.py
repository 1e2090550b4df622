"""The agent gateway's HTTPS endpoints: join, reports, commands (`jobs.services.agent_gateway` is the rule).

- `POST /api/v1/agent/join` `{token, hostname, agent_version}` -> 201
  `{node, credential, sample_seconds, heartbeat_seconds}`; no other
  authentication, anonymous throttling.
- `POST /api/v1/agent/reports` `{messages: [...]}` -> 200 `{accepted}`;
  403 with every refused message when any is not the node's own (nothing
  is delivered), 503 when the broker cannot take them (send again).
- `GET /api/v1/agent/commands?wait=S&ack=ID,...` -> 200 `{commands: [...]}`,
  waiting up to S seconds (at most 25) for the first; `ack` names the
  commands the previous poll brought (the others are handed out again).

The last two take `Authorization: Node <credential>` and nothing else.
"""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.db import connection
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.api.errors import error_body
from common.api.throttling import AnonymousThrottle
from inventory.authentication import IsNodeAgent, NodeCredentialAuthentication, NodePrincipal
from inventory.services.agents import JoinRefused, is_cut_off, redeem_join_token
from jobs import tasks as _report_tasks  # noqa: F401 -- registers the report tasks whose arguments the gateway checks
from jobs.services import agent_gateway

MAX_WAIT_SECONDS = 25.0


class JoinSerializer(serializers.Serializer):
    token = serializers.CharField(max_length=200)
    hostname = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")
    agent_version = serializers.CharField(max_length=40, required=False, allow_blank=True, default="")


# The gateway speaks to agents, not to API clients: its protocol is docs/fleet.md, not the published schema.
@extend_schema(exclude=True)
class AgentJoinEndpoint(APIView):
    """Exchange a one-time join token for the credential of its node (shown once)."""

    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []
    throttle_classes = [AnonymousThrottle]

    def post(self, request: Request) -> Response:
        data = JoinSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            issued = redeem_join_token(
                secret=data.validated_data["token"],
                host=data.validated_data["hostname"],
                agent_version=data.validated_data["agent_version"],
            )
        except JoinRefused as refused:
            return Response(error_body("join_refused", str(refused)), status=status.HTTP_403_FORBIDDEN)
        return Response(
            {
                "node": issued.row.node.name,
                "credential": issued.secret,
                "sample_seconds": float(settings.GPU_SAMPLE_SECONDS),
                "heartbeat_seconds": float(settings.NODE_HEARTBEAT_SECONDS),
            },
            status=status.HTTP_201_CREATED,
        )


def _release_database() -> None:
    """Give this request's database connection back to the pool before it waits on something else."""
    if not connection.in_atomic_block:  # a test's transaction (or ATOMIC_REQUESTS) keeps it
        connection.close()


class _AgentEndpoint(APIView):
    authentication_classes = [NodeCredentialAuthentication]
    permission_classes = [IsNodeAgent]
    throttle_classes: list[Any] = []

    def principal(self) -> NodePrincipal:
        user = self.request.user
        assert isinstance(user, NodePrincipal)  # IsNodeAgent let nothing else in
        return user


@extend_schema(exclude=True)
class AgentReportsEndpoint(_AgentEndpoint):
    """Take a batch of the node's reports: all are delivered, or none when any is malformed (400, naming each bad
    field) or not the node's own (403)."""

    def post(self, request: Request) -> Response:
        node = self.principal().node
        messages = request.data.get("messages") if isinstance(request.data, dict) else None
        if not isinstance(messages, list):
            body = error_body("validation_error", 'The body is {"messages": [...]}.')
            return Response(body, status=status.HTTP_400_BAD_REQUEST)
        rejected = agent_gateway.check_messages(node, messages)
        if any(r.invalid for r in rejected):
            body = error_body("validation_error", f"{len(rejected)} message(s) are malformed; none was taken.")
            body["error"]["rejected"] = [r.as_dict() for r in rejected]
            return Response(body, status=status.HTTP_400_BAD_REQUEST)
        if rejected:
            body = error_body("not_this_node", f"{len(rejected)} message(s) are not {node.name}'s to send.")
            body["error"]["rejected"] = [r.as_dict() for r in rejected]
            return Response(body, status=status.HTTP_403_FORBIDDEN)
        # The broker may keep delivery waiting (a busy Redis, a reconnect): not while holding a database connection
        # that every other agent's request needs too.
        _release_database()
        try:
            accepted = agent_gateway.deliver_messages(node, messages)
        except Exception:
            # The broker is away: the agent keeps the batch and sends it again (reports are idempotent).
            agent_gateway.log.exception("delivering %d messages of %s failed", len(messages), node.name)
            body = error_body("unavailable", "The console cannot take reports right now; send them again.")
            return Response(body, status=status.HTTP_503_SERVICE_UNAVAILABLE)
        return Response({"accepted": accepted})


@extend_schema(exclude=True)
class AgentCommandsEndpoint(_AgentEndpoint):
    """Hand the node the commands waiting on its queue, waiting up to `wait` seconds for the first."""

    def get(self, request: Request) -> Response:
        node, credential = self.principal().node, self.principal().credential
        try:
            wait = float(request.query_params.get("wait", "0"))
        except ValueError:
            wait = math.nan
        if not math.isfinite(wait):
            body = error_body("validation_error", "wait is a number of seconds.")
            return Response(body, status=status.HTTP_400_BAD_REQUEST)
        wait = min(max(wait, 0.0), MAX_WAIT_SECONDS)
        # The wait holds no database connection (a thousand waiting agents would hold a thousand): a
        # revocation meanwhile wakes it and reaches it through the cache.
        _release_database()
        acked = [part for part in request.query_params.get("ack", "").split(",") if part][
            : agent_gateway.MAX_COMMANDS * 4
        ]
        commands = agent_gateway.take_commands(
            node, wait=wait, still_allowed=lambda: not is_cut_off(credential), acked=acked
        )
        return Response({"commands": commands})
