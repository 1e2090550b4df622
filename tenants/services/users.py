"""Platform accounts."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction

from common.errors import invalid
from tenants.context import Actor
from tenants.services.audit import record_audit_event


@transaction.atomic
def create_operator(*, actor: Actor, username: str, password: str, email: str = "") -> User:
    """Create a platform operator (staff and superuser) and return it.

    Raises ValidationError when the username is taken or the password fails
    the password rules. Used by `gpucloud up` for the first account and by
    `gpucloud createoperator`.
    """
    if User.objects.filter(username=username).exists():
        raise invalid("username", "unique", f"User {username!r} already exists.")
    user = User(username=username, email=email, is_staff=True, is_superuser=True)
    try:
        validate_password(password, user)
    except ValidationError as error:
        raise ValidationError({"password": error.error_list}) from None
    user.set_password(password)
    user.save()
    record_audit_event(
        actor=actor,
        action="user.create_operator",
        obj=user,
        tenant_id=None,
        after={"username": username, "operator": True},
    )
    return user
