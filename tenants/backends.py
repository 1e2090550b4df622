"""The authentication backend: Django's model backend behind the login throttle.

Every password login (the console's login page and the Django admin's)
passes through here, so a locked (username, address) pair is refused before
its password is even checked, wherever the attempt comes from.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

from tenants.context import current_request_info
from tenants.services import clear_login_failures, login_locked_for, record_login_failure


class ThrottledModelBackend(ModelBackend):
    """Username and password authentication with a lockout after repeated failures."""

    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> User | None:
        if username is None or password is None:
            return None
        address = current_request_info().source_ip
        if login_locked_for(username, address):
            # PermissionDenied stops Django from trying any other backend.
            raise PermissionDenied("Too many failed logins.")
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            record_login_failure(username, address)
        else:
            clear_login_failures(username, address)
        return user
