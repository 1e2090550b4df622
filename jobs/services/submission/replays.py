"""Idempotency keys: a request whose key was used before replays its first result, or is refused (step 5).

A batch's requests that repeat an earlier request's key wait for a second
round (`split_repeated_keys`), so they see its rows as a retry would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from common.errors import Conflict
from jobs.models import Workload
from jobs.services.spec import fingerprint
from jobs.services.submission.pending import Pending, Submission, SubmissionRequest


def split_repeated_keys(requests: Sequence[SubmissionRequest]) -> tuple[list[int], list[int]]:
    seen: set[tuple[int, int | None, str]] = set()
    first: list[int] = []
    again: list[int] = []
    for index, request in enumerate(requests):
        key = request.idempotency_key
        if key is None:
            first.append(index)
            continue
        identity = (request.project.tenant_id, request.actor.user.pk if request.actor.user else None, key)
        (again if identity in seen else first).append(index)
        seen.add(identity)
    return first, again


def item_keys(key: str, count: int) -> list[str]:
    # The first workload carries the key itself, so a single submission and a
    # one-item bulk one with the same key and body are the same request.
    return [key, *(f"{key}#{index}" for index in range(1, count))]


def replays(pending: list[Pending]) -> list[Pending]:
    """Answer each request that broke no rule so far and whose key was used before with the workloads it
    created (or refuse it when the request differs); return the others.

    Two queries for the whole batch, none when no request has a key.
    """
    # A request that breaks a rule is refused whatever its key: it is no retry of an accepted one.
    clean = [item for item in pending if not item.errors]
    keyed = [item for item in clean if item.request.idempotency_key is not None]
    for item in clean:
        item.digest = fingerprint(item.project.pk, item.specs)
    if not keyed:
        return pending
    firsts = _keyed_workloads(keyed, lambda item: [str(item.request.idempotency_key)])
    replayed = [item for item in keyed if _identity(item, str(item.request.idempotency_key)) in firsts]
    every = _keyed_workloads(replayed, _all_keys) if replayed else {}
    for item in replayed:
        existing = firsts[_identity(item, str(item.request.idempotency_key))]
        if existing.request_fingerprint != item.digest:
            item.outcome = Conflict(
                "This Idempotency-Key was already used with a different request; use a new key for a new request.",
                code="idempotency_key_reused",
                details={"workload": existing.pk},
            )
        else:
            item.outcome = Submission(workloads=[every[_identity(item, key)] for key in _all_keys(item)], created=False)
    return [item for item in pending if item.outcome is None]


def _all_keys(item: Pending) -> list[str]:
    return item_keys(str(item.request.idempotency_key), len(item.specs))


def _identity(item: Pending, key: str) -> tuple[int, int, str]:
    return (item.project.tenant_id, item.user.pk, key)


def _keyed_workloads(
    items: list[Pending], keys_of: Callable[[Pending], list[str]]
) -> dict[tuple[int, int, str], Workload]:
    """Return the workloads carrying the keys `keys_of` gives for each item, by (tenant, owner, key); one query."""
    wanted = {_identity(item, key) for item in items for key in keys_of(item)}
    found = Workload.all_tenants.filter(
        tenant_id__in={t for t, _, _ in wanted},
        owner_id__in={o for _, o, _ in wanted},
        idempotency_key__in={k for _, _, k in wanted},
    ).select_related("project", "pool", "owner")
    by_identity = {(w.tenant_id, w.owner_id, str(w.idempotency_key)): w for w in found}
    return {identity: w for identity, w in by_identity.items() if identity in wanted}
