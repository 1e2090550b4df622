"""Prices: operators add them from a date on, and remove only those whose date has not come."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation

from django.db import IntegrityError, transaction

from accounting.choices import Resource
from accounting.models import Price
from common.errors import Conflict, FieldErrors, add_errors, invalid, raise_errors
from inventory.models import NodePool
from tenants.context import Actor
from tenants.services.access import require_operator
from tenants.services.audit import delete_audited, record_audit_event, snapshot

PRICE_FIELDS = ["resource", "pool", "gpu_model", "amount_per_hour", "effective_from"]
MAX_AMOUNT = Decimal("99999999.9999")  # the column's 12 digits, 4 after the point


def price_errors(
    *, resource: str, amount_per_hour: object, pool: str, gpu_model: str, effective_from: datetime, now: datetime
) -> FieldErrors:
    """Return every rule the price breaks, by field (empty when it may be added)."""
    errors: FieldErrors = {}
    if pool and not NodePool.objects.filter(name=pool).exists():
        add_errors(errors, invalid("pool", "not_found", f"There is no pool {pool!r}."))
    if resource not in Resource.values:
        add_errors(errors, invalid("resource", "invalid_choice", f"Choose one of {', '.join(Resource.values)}."))
    try:
        amount = Decimal(str(amount_per_hour))
        if not amount.is_finite() or amount < 0 or amount > MAX_AMOUNT or amount != amount.quantize(Decimal("0.0001")):
            raise InvalidOperation
    except (InvalidOperation, ValueError):
        add_errors(
            errors,
            invalid("amount_per_hour", "invalid_amount", f"Give an amount from 0 to {MAX_AMOUNT}, at most 4 decimals."),
        )
    if gpu_model and resource != Resource.GPU:
        add_errors(errors, invalid("gpu_model", "gpu_only", "Only a GPU price names a GPU model."))
    if len(gpu_model) > 100:
        add_errors(errors, invalid("gpu_model", "too_long", "At most 100 characters."))
    if effective_from < now:
        add_errors(
            errors,
            invalid(
                "effective_from",
                "in_the_past",
                "A price takes effect now or later: reports of the past never change.",
            ),
        )
    return errors


@transaction.atomic
def add_price(
    *,
    actor: Actor,
    resource: str,
    amount_per_hour: Decimal,
    now: datetime,
    pool: str = "",
    gpu_model: str = "",
    effective_from: datetime | None = None,
) -> Price:
    """Add the price of one hour of `resource` in the pool named `pool` (every pool when empty) from
    `effective_from` (default `now`) on; operators only.

    Raises PermissionDenied, or ValidationError naming every failing field
    (`resource`, `amount_per_hour`, `pool`, `gpu_model`, `effective_from`:
    rules `invalid_choice`, `invalid_amount`, `not_found`, `gpu_only`,
    `too_long`, `in_the_past`, `unique`), nothing written.
    """
    require_operator(actor)
    start = effective_from or now
    raise_errors(
        price_errors(
            resource=resource,
            amount_per_hour=amount_per_hour,
            pool=pool,
            gpu_model=gpu_model,
            effective_from=start,
            now=now,
        )
    )
    price = Price(
        resource=resource,
        pool=NodePool.objects.get(name=pool) if pool else None,
        gpu_model=gpu_model,
        amount_per_hour=Decimal(str(amount_per_hour)),
        effective_from=start,
        created_by=actor.user,
    )
    try:
        with transaction.atomic():  # a savepoint: a twin's insert fails without spoiling the caller's transaction
            price.save()
    except IntegrityError:
        raise invalid("effective_from", "unique", "This price already has a change at that moment.") from None
    record_audit_event(
        actor=actor, action="price.create", obj=price, tenant_id=None, after=snapshot(price, PRICE_FIELDS)
    )
    return price


@transaction.atomic
def remove_price(*, actor: Actor, price: Price, now: datetime) -> None:
    """Remove a price that has not taken effect yet; operators only.

    Raises PermissionDenied, or Conflict (`price_in_effect`) once its date has
    come: past reports must keep pricing the past as they did.
    """
    require_operator(actor)
    if price.effective_from <= now:
        raise Conflict(
            "This price is in effect or was: it stays so that reports of the past never change. "
            "Add a new price from a later date instead.",
            code="price_in_effect",
        )
    delete_audited(actor=actor, action="price.delete", obj=price, tenant_id=None, audited=PRICE_FIELDS)
