"""Node credential authentication for the agent gateway: `Authorization: Node gpcn_<prefix>_<key>`.

Only the gateway's endpoints accept it, and they accept nothing else: a
node credential opens no user endpoint, and no user session or API token
opens the gateway. `request.user` becomes a `NodePrincipal`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from inventory.models import Node, NodeCredential
from inventory.services.agents import CredentialRejected, authenticate_node


@dataclass(frozen=True)
class NodePrincipal:
    """Who a gateway request comes from: the agent of one node, and nothing more."""

    node: Node
    credential: NodeCredential
    is_authenticated: bool = True
    is_active: bool = True
    is_staff: bool = False
    pk: None = None

    def get_username(self) -> str:
        return f"node:{self.node.name}"


class NodeCredentialAuthentication(BaseAuthentication):
    """Authenticate a request by a node credential; `request.auth` becomes the NodeCredential."""

    keyword = "Node"

    def authenticate(self, request: Request) -> tuple[NodePrincipal, NodeCredential] | None:
        header = get_authorization_header(request).decode("latin-1").split()
        if not header or header[0].lower() != self.keyword.lower():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("The Authorization header must be 'Node <credential>'.")
        try:
            credential = authenticate_node(header[1])
        except CredentialRejected as rejected:
            raise exceptions.AuthenticationFailed(str(rejected)) from None
        return NodePrincipal(credential.node, credential), credential

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="agent"'


class IsNodeAgent(BasePermission):
    """Allow only requests authenticated by a node credential."""

    def has_permission(self, request: Request, view: object) -> bool:
        return isinstance(request.user, NodePrincipal)
