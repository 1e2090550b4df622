"""Whether a request's credentials name someone: the body limit's question (common.bodylimit), asked before Django."""

from __future__ import annotations

from importlib import import_module

from django.conf import settings

from inventory.services.agents import CredentialRejected, authenticate_node
from tenants.services.tokens import TokenRejected, authenticate_secret


def has_valid_credentials(authorization: str, session_key: str | None) -> bool:
    """Return whether `authorization` names a live API token or node credential, or `session_key` a signed-in
    session (reads only; a refused credential is simply not one)."""
    scheme, _, secret = authorization.partition(" ")
    secret = secret.strip()
    if scheme.lower() == "bearer" and secret:
        try:
            authenticate_secret(secret)
            return True
        except TokenRejected:
            return False
    if scheme.lower() == "node" and secret:
        try:
            authenticate_node(secret)
            return True
        except CredentialRejected:
            return False
    if session_key:
        store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
        return bool(store.get("_auth_user_id"))
    return False
