"""The checks of a submission, each over a whole batch at once (steps 1 to 4 and 6 of the package's order).

Who may submit, and a request that is no list of items, refuse it outright:
its outcome is set (`check_each`) and it leaves the running. Every other
rule adds what it finds to the request's `errors` and leaves it in, so that
the field rules of its items and the database rules of every field that
passed its own (`drafts`) are named together; `refuse_invalid` refuses it
after the last check, before anything is written. Each read serves the
whole batch, however many of its requests break rules. The rules
themselves live in `jobs.services.spec` (fields), `jobs.services.images`
(images) and `jobs.services.quota_rules` (pools, the ledger's limits and budgets).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError

from common.errors import FieldErrors, invalid
from jobs.services import images
from jobs.services import quota_rules as rules
from jobs.services.spec import WorkloadSpec, field_of, prefixed
from jobs.services.submission.drafts import Draft, draft
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
    """Read the request's items into drafts with every field rule they break; then the pool and preset rules.

    Raises ValidationError on `items` (a request without items, or too many): nothing else can be checked.
    """
    request = item.request
    _check_count(request.items)
    refused = request.refused or [()] * len(request.items)
    item.drafts = [draft(data, refused=fields) for data, fields in zip(request.items, refused, strict=True)]
    try:
        _check_key(request.idempotency_key)
    except ValidationError as error:
        _add(item, -1, error, frozenset())
    tenant_id = request.project.tenant_id
    for index, found in enumerate(item.drafts):
        if found.errors:
            _add(item, index, ValidationError(found.errors), frozenset())
        if found.spec is None:
            continue
        _gather(item, index, found.broken, _check_preset, found.spec, tenant_id)
        try:
            rules.check_pool_open(found.spec, tenant_id)
        except ValidationError as error:
            _add(item, index, error, found.broken)
            # The rules of a pool the item may not use would only add noise: the later rules leave it out.
            found.spec, found.broken = None, found.broken | {"pool"}


def check_images(pending: list[Pending]) -> list[Pending]:
    """Hold the image of every item whose image follows its own rule to the tenant's allow-list."""
    policies = images.policies_for_tenants({item.project.tenant_id for item in pending})
    for item in pending:
        policy = policies[item.project.tenant_id]
        if not policy.enforced:
            continue
        for index, found in enumerate(item.drafts):
            if found.image is not None:
                _gather(item, index, found.broken, images.check_image_allowed, policy, found.image, found.kind)
    return pending


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
    for item in pending:
        pools = _distinct_pools(item.specs)
        item.limits = {p.pk: found[(item.project.pk, p.pk)] for p in pools if (item.project.pk, p.pk) in found}
        _gather(item, -1, frozenset(), rules.check_quotas_exist, item.project, pools, item.limits)
    return pending


def check_limits(pending: list[Pending]) -> list[Pending]:
    """Fill in each item's maximum runtime from its quota, and hold it to the quota's limits."""
    for item in pending:
        for index, found in _in_quota(item):
            spec = found.spec
            assert spec is not None  # `_in_quota` yields only drafts with a pool
            limit = item.limits[spec.pool.pk]
            try:
                found.spec = rules.with_runtime_default(spec, limit)
            except ValidationError as error:
                _add(item, index, error, found.broken)
            try:
                rules.check_gpu_limit(spec, limit, item.project)
            except ValidationError as error:
                _add(item, index, error, found.broken)
    return pending


def check_placement(pending: list[Pending]) -> list[Pending]:
    """Hold every item asking for GPUs to what its pool could ever place; one query for the batch."""
    pool_ids = {d.spec.pool.pk for item in pending for _, d in _in_quota(item) if d.spec and d.spec.gpus_per_replica}
    nodes = rules.gpus_by_node(sorted(pool_ids))
    for item in pending:
        for index, found in _in_quota(item):
            spec = found.spec
            assert spec is not None  # `_in_quota` yields only drafts with a pool
            _gather(item, index, found.broken, rules.check_placement, spec, nodes)
    return pending


def check_counts(pending: list[Pending]) -> list[Pending]:
    """Hold each request to the count limits, counting the requests of the batch accepted before it."""
    specs = {id(item): [d.spec for _, d in _in_quota(item) if d.spec is not None] for item in pending}
    needs = [rules.CountNeed(specs[id(item)], item.limits, item.project, item.user) for item in pending]
    counts = rules.load_counts(needs)
    for item in pending:
        mine = specs[id(item)]
        _gather(item, -1, frozenset(), rules.check_counts, mine, item.limits, item.project, item.user, counts)
        if not item.errors:
            counts.add(mine, item.project, item.user)
    return pending


def check_budgets(pending: list[Pending]) -> list[Pending]:
    """Hold each request to the budgets of its project and tenant: a used-up one may refuse new work."""
    used_up = rules.used_up_budgets({item.project.pk: item.project for item in pending}.values())
    for item in pending:
        _gather(item, -1, frozenset(), rules.check_budget, item.project, used_up)
    return pending


def refuse_invalid(pending: list[Pending]) -> list[Pending]:
    """Refuse each request that breaks any rule, naming every one (an item's errors together); return the rest."""
    kept: list[Pending] = []
    for item in pending:
        if item.errors:
            item.outcome = ValidationError(dict(sorted(item.errors.items(), key=_item_order)))
        else:
            kept.append(item)
    return kept


_ITEM_INDEX = re.compile(r"items\[(\d+)\]")


def _item_order(entry: tuple[str, Any]) -> int:
    """Sort key: a bulk's errors item by item (a stable sort keeps each item's field rules first)."""
    found = _ITEM_INDEX.match(entry[0])
    return int(found.group(1)) if found else -1


def _in_quota(item: Pending) -> list[tuple[int, Draft]]:
    """Return the drafts (with their index) whose pool the project has a quota in: those the ledger's rules read."""
    return [(i, d) for i, d in enumerate(item.drafts) if d.spec is not None and d.spec.pool.pk in item.limits]


def _gather(item: Pending, index: int, broken: frozenset[str], check: Callable[..., object], *args: Any) -> None:
    """Run `check(*args)`; add what it raises to the request's errors (see `_add`)."""
    try:
        check(*args)
    except ValidationError as error:
        _add(item, index, error, broken)


def _add(item: Pending, index: int, error: ValidationError, broken: frozenset[str]) -> None:
    """Add `error` to the request's errors, under `items[index].` in a bulk (index -1: about the request),
    leaving out what it says about a field that broke its own rule (that rule is reported already)."""
    if item.request.bulk and index >= 0:
        error = prefixed(error, f"items[{index}].")
        broken = frozenset(f"items[{index}].{name}" for name in broken)
    found: FieldErrors = error.error_dict if hasattr(error, "error_dict") else {"non_field_errors": error.error_list}
    for path, messages in found.items():
        if not broken or _owner(path) not in broken:
            item.errors.setdefault(path, []).extend(messages)


def _owner(path: str) -> str:
    """Return the field an error path is about, with its item (`items[2].env.HOME` -> `items[2].env`)."""
    if path.startswith("items["):
        head, _, rest = path.partition("].")
        return f"{head}].{field_of(rest)}"
    return field_of(path)


def _check_key(key: str | None) -> None:
    if key is None:
        return
    if not key or len(key) > MAX_IDEMPOTENCY_KEY_LENGTH or not key.isprintable():
        raise invalid(
            "idempotency_key",
            "invalid",
            f"The Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} printable characters.",
        )


def _check_count(items: Sequence[Mapping[str, Any]]) -> None:
    if not items:
        raise invalid("items", "empty", "Submit at least one workload.")
    if len(items) > MAX_BULK_ITEMS:
        raise invalid("items", "too_many", f"Submit at most {MAX_BULK_ITEMS} workloads at once.")


def _check_preset(spec: WorkloadSpec, tenant_id: int) -> None:
    # Interfaces resolve presets through the tenant's scope; this holds for any caller.
    if spec.preset is not None and spec.preset.tenant_id != tenant_id:
        raise invalid("preset", "does_not_exist", "No such launch preset in this tenant.")


def _distinct_pools(specs: Sequence[WorkloadSpec]) -> list[Any]:
    return list({spec.pool.pk: spec.pool for spec in specs}.values())
