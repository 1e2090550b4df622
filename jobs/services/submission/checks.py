"""The checks of a submission, each over a whole batch at once (steps 1 to 4 and 6 of the package's order).

Each takes the requests still in the running and returns those it did not
refuse; a refusal is set as the request's outcome (`check_each`). The
rules themselves live in `jobs.services.spec` (fields), `jobs.services.images`
(pools and images) and `jobs.services.quota_rules` (the ledger's limits).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError

from common.errors import invalid
from jobs.services import images
from jobs.services import quota_rules as rules
from jobs.services.spec import WorkloadSpec, check_spec, prefixed
from jobs.services.submission.pending import Pending, check_each
from tenants.choices import Role
from tenants.models import Membership
from tenants.services.access import require_role

MAX_BULK_ITEMS = 2000
MAX_IDEMPOTENCY_KEY_LENGTH = 200


def check_submitters(pending: list[Pending]) -> list[Pending]:
    """Who may submit: members into the projects they are assigned to, admins and operators into any.

    Keeps the requests in their order: later steps (count limits) take them in turn.
    """
    pending = check_each(pending, _check_role)
    assigned = _assignments({_assignment(item) for item in pending if not item.role.at_least(Role.ADMIN)})

    def check(item: Pending) -> None:
        if not item.role.at_least(Role.ADMIN) and _assignment(item) not in assigned:
            raise PermissionDenied(
                f"You are not a member of project {item.project.slug}; ask a tenant admin to add you."
            )

    return check_each(pending, check)


def _assignment(item: Pending) -> tuple[int, int, int]:
    return (item.project.tenant_id, item.user.pk, item.project.pk)


def _check_role(item: Pending) -> None:
    request = item.request
    if request.role is None:
        item.role = require_role(request.actor, request.project.tenant, Role.MEMBER)
    elif not request.role.at_least(Role.MEMBER):
        raise PermissionDenied(f"This needs the member role in tenant {request.project.tenant.slug}.")
    else:
        item.role = request.role
    assert request.actor.user is not None  # a role comes only with a user
    item.owner = request.actor.user


def _assignments(wanted: set[tuple[int, int, int]]) -> set[tuple[int, int, int]]:
    """Return which (tenant, user, project) triples are memberships assigned to the project; one query."""
    if not wanted:
        return set()
    rows = Membership.all_tenants.filter(
        tenant_id__in={t for t, _, _ in wanted},
        user_id__in={u for _, u, _ in wanted},
        projects__in={p for _, _, p in wanted},
    ).values_list("tenant_id", "user_id", "projects")
    return set(rows) & wanted


def check_input(item: Pending) -> None:
    request = item.request
    _check_key(request.idempotency_key)
    item.specs = _specs(request.items, bulk=request.bulk)
    _check_presets(item.specs, request.project.tenant_id, bulk=request.bulk)
    rules.check_pool_open(item.specs, request.project.tenant_id, bulk=request.bulk)


def check_images(pending: list[Pending]) -> list[Pending]:
    policies = images.policies_for_tenants({item.project.tenant_id for item in pending})

    def check(item: Pending) -> None:
        tenant_id = item.project.tenant_id
        images.check_images(item.specs, tenant_id, bulk=item.request.bulk, policy=policies[tenant_id])

    return check_each(pending, check)


def lock_limits(pending: list[Pending]) -> list[Pending]:
    """Read the limits of every project and pool of the batch, locking the quota rows where order matters.

    Concurrent submissions into a project and pool take turns (the rows are
    locked, in one query and one order) when a count limit applies there,
    so it holds however many arrive at once, and when a submission into the
    project carries an Idempotency-Key, so that a retry racing its first
    attempt replays it. Otherwise nothing a submission checks can change
    under it, and submissions into the same project go side by side.
    """
    pairs = {(item.project.pk, spec.pool) for item in pending for spec in item.specs}
    found = rules.limits_of(pairs, lock=False)
    keyed = {item.project.pk for item in pending if item.request.idempotency_key is not None}
    in_turn = {(p, pool) for p, pool in pairs if p in keyed or ((p, pool.pk) in found and found[(p, pool.pk)].counted)}
    if in_turn:
        found.update(rules.limits_of(in_turn, lock=True))

    def check(item: Pending) -> None:
        pools = _distinct_pools(item.specs)
        item.limits = {p.pk: found[(item.project.pk, p.pk)] for p in pools if (item.project.pk, p.pk) in found}
        rules.check_quotas_exist(item.project, pools, item.limits)

    return check_each(pending, check)


def check_limits(item: Pending) -> None:
    bulk = item.request.bulk
    item.specs = rules.with_runtime_defaults(item.specs, item.limits, bulk=bulk)
    rules.check_gpu_limits(item.specs, item.limits, item.project, bulk=bulk)


def check_placement(pending: list[Pending]) -> list[Pending]:
    nodes = rules.gpus_by_node(sorted({s.pool.pk for item in pending for s in item.specs if s.gpus_per_replica > 0}))
    return check_each(pending, lambda item: rules.check_placement(item.specs, bulk=item.request.bulk, nodes=nodes))


def check_counts(pending: list[Pending]) -> list[Pending]:
    """Hold each request to the count limits, counting the requests of the batch accepted before it."""
    counts = rules.load_counts([rules.CountNeed(item.specs, item.limits, item.project, item.user) for item in pending])

    def check(item: Pending) -> None:
        rules.check_counts(item.specs, item.limits, item.project, item.user, counts)
        counts.add(item.specs, item.project, item.user)

    return check_each(pending, check)


def _check_key(key: str | None) -> None:
    if key is None:
        return
    if not key or len(key) > MAX_IDEMPOTENCY_KEY_LENGTH or not key.isprintable():
        raise invalid(
            "idempotency_key",
            "invalid",
            f"The Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} printable characters.",
        )


def _specs(items: Sequence[Mapping[str, Any]], *, bulk: bool) -> list[WorkloadSpec]:
    if not items:
        raise invalid("items", "empty", "Submit at least one workload.")
    if len(items) > MAX_BULK_ITEMS:
        raise invalid("items", "too_many", f"Submit at most {MAX_BULK_ITEMS} workloads at once.")
    specs: list[WorkloadSpec] = []
    errors: dict[str, Any] = {}
    for index, data in enumerate(items):
        try:
            spec = WorkloadSpec.from_data(data)
            check_spec(spec)
            specs.append(spec)
        except ValidationError as error:
            errors.update((prefixed(error, f"items[{index}].") if bulk else error).error_dict)
    if errors:
        raise ValidationError(errors)
    return specs


def _check_presets(specs: Sequence[WorkloadSpec], tenant_id: int, *, bulk: bool) -> None:
    # Interfaces resolve presets through the tenant's scope; this holds for any caller.
    for index, spec in enumerate(specs):
        if spec.preset is not None and spec.preset.tenant_id != tenant_id:
            error = invalid("preset", "does_not_exist", "No such launch preset in this tenant.")
            raise prefixed(error, f"items[{index}].") if bulk else error


def _distinct_pools(specs: Sequence[WorkloadSpec]) -> list[Any]:
    return list({spec.pool.pk: spec.pool for spec in specs}.values())
