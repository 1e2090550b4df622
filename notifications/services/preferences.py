"""People's own choices: which event kinds reach them by e-mail, per tenant (and the platform's, for operators)."""

from __future__ import annotations

from collections.abc import Mapping

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from common.errors import FieldErrors, raise_errors
from notifications import selectors
from notifications.models import NotificationPreference
from notifications.selectors import EmailChoice
from tenants.choices import Role
from tenants.context import Actor
from tenants.models import Tenant
from tenants.services.access import require_operator, require_role


def choice_errors(choices: Mapping[str, object], *, tenant_id: int | None) -> FieldErrors:
    """Return what is wrong with `choices` ({kind: bool}), each kind named: unknown kinds and non-booleans."""
    allowed = {kind.value for kind in selectors.kinds_for(tenant_id)}
    errors: FieldErrors = {}
    for kind, value in choices.items():
        if kind not in allowed:
            errors[kind] = [
                ValidationError(f"Unknown event kind; choose from {', '.join(sorted(allowed))}.", code="unknown_kind")
            ]
        elif not isinstance(value, bool):
            errors[kind] = [ValidationError("Must be true or false.", code="invalid")]
    return errors


@transaction.atomic
def set_email_choices(*, actor: Actor, tenant: Tenant | None, choices: Mapping[str, bool]) -> list[EmailChoice]:
    """Record the acting user's e-mail choice for each kind in `choices` in `tenant` (the platform's kinds, for
    operators, when None); return all their choices there.

    Anyone with a role in the tenant chooses their own. Raises
    ValidationError naming every bad kind at once (`choice_errors`),
    PermissionDenied for a non-operator on the platform's kinds or for an
    actor that is no user, Http404 for a tenant the actor cannot see.
    """
    user = actor.user
    if user is None:
        raise PermissionDenied("Choices belong to people.")
    if tenant is None:
        require_operator(actor)
    else:
        require_role(actor, tenant, Role.VIEWER)
    tenant_id = tenant.pk if tenant is not None else None
    raise_errors(choice_errors(choices, tenant_id=tenant_id))
    for kind, email in choices.items():
        selectors.owned_by(NotificationPreference, tenant_id).update_or_create(
            tenant=tenant, user=user, kind=kind, defaults={"email": email}
        )
    return selectors.email_choices(user, tenant_id)
