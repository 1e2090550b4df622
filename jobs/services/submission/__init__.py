"""Workload submission: one path for the API, the UI and the CLI.

The order of a submission, all in one transaction:

1. who may submit: members into the projects they are assigned to, tenant
   admins (and operators) into any project of the tenant; viewers never;
2. the field rules of every item (no database), after filling in what an
   item leaves out from its launch preset, and the pool is open to the tenant;
3. the image is on the tenant's allow-list (`jobs.services.images`);
4. read the project's limits in the pools concerned, locking its quota rows
   when a count limit applies or the request has an Idempotency-Key, so
   concurrent submissions into the same project and pool take turns there:
   count limits hold however many arrive at once, and a retry racing its
   first attempt replays it;
5. an `Idempotency-Key` seen before returns the first result when the
   request is the same, and is refused when it differs (only a request
   that broke no rule so far is a retry);
6. the rules that read the ledger (quota, GPU models, largest placement,
   count limits, maximum runtime, used-up budgets), each set-based over all items; then a
   request that broke any rule of steps 2 to 6 is refused with every one;
7. insert the workloads and their `workload.submitted` events in bulk, one
   audit event for the call, and ask for a scheduling pass after commit.

A single submission reads the ledger in at most seven queries whatever it
asks for (role, quota rows with the tenant's limits, allowed images, GPUs
of the pool, the counts a limit needs, and the budgets that may refuse it:
two more when one of them exists), and writes in three. So does a
batch of independent submissions (`submit_batch`), each step reading for
all of them at once; the API's ingest path commits concurrent requests
together that way.

Any refusal comes before anything is written; a bulk submission is all or nothing.
A request's rules do not stop at the first one it breaks: the field rules
of every item, and the database rules of every field that passed its own
(`drafts`), are answered in one ValidationError, each under its field path.
`submission_errors` runs the same steps (1 to 4 and 6) without writing, for
an interface that could not parse every field: it names what the fields it
did parse break, to be answered together with its own errors.

Read it one module at a time: this one is the entry points and the order
of the steps (`_submit_round`); `pending` the request as it goes through
them; `drafts` an item as far as its fields follow their rules; `checks` steps 1
to 4 and 6; `replays` step 5; `writes` step 7.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from django.core.exceptions import ValidationError
from django.db import DatabaseError, transaction

from common.errors import FieldErrors
from jobs.models import Workload
from jobs.services.spec import WorkloadSpec, prefixed
from jobs.services.submission.checks import (
    MAX_BULK_ITEMS,
    MAX_IDEMPOTENCY_KEY_LENGTH,
    check_budgets,
    check_counts,
    check_images,
    check_input,
    check_limits,
    check_placement,
    check_submitters,
    lock_limits,
    refuse_invalid,
)
from jobs.services.submission.drafts import draft
from jobs.services.submission.pending import REFUSALS, Pending, Submission, SubmissionRequest, check_each
from jobs.services.submission.replays import replays, split_repeated_keys
from jobs.services.submission.writes import NOTEBOOK_PORT, insert
from tenants.context import Actor
from tenants.models import Project

__all__ = [
    "MAX_BULK_ITEMS",
    "MAX_IDEMPOTENCY_KEY_LENGTH",
    "NOTEBOOK_PORT",
    "REFUSALS",
    "Submission",
    "SubmissionRequest",
    "dry_run",
    "submission_errors",
    "submit",
    "submit_batch",
    "submit_workload",
    "submit_workloads",
]


def submit_workload(
    *, actor: Actor, project: Project, data: Mapping[str, Any], idempotency_key: str | None = None
) -> Workload:
    """Submit one workload into `project` and return it (the first one for a retried `idempotency_key`).

    Raises PermissionDenied, Http404 (no role in the tenant), ValidationError
    naming the field and rule, or Conflict (key reused with another request).
    """
    return submit(actor=actor, project=project, items=[data], idempotency_key=idempotency_key).workloads[0]


def submit_workloads(
    *, actor: Actor, project: Project, items: Sequence[Mapping[str, Any]], idempotency_key: str | None = None
) -> list[Workload]:
    """Submit many workloads into `project` at once, all or nothing; errors name `items[i].field`.

    Raises as `submit_workload` does.
    """
    return submit(actor=actor, project=project, items=items, idempotency_key=idempotency_key, bulk=True).workloads


def submit(
    *,
    actor: Actor,
    project: Project,
    items: Sequence[Mapping[str, Any]],
    idempotency_key: str | None = None,
    bulk: bool = False,
) -> Submission:
    """Submit `items` into `project`; return the workloads and whether they are new (False: a replayed key).

    The implementation behind `submit_workload` and `submit_workloads`, for
    interfaces that answer a replay differently (the API's 200 instead of 201).
    """
    request = SubmissionRequest(actor=actor, project=project, items=items, idempotency_key=idempotency_key, bulk=bulk)
    outcome = submit_batch([request])[0]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def submit_batch(requests: Sequence[SubmissionRequest]) -> list[Submission | Exception]:
    """Submit several independent requests in one transaction; return each one's Submission or refusal.

    Each request succeeds or fails on its own, all or nothing within itself,
    exactly as if it had been submitted alone after the ones before it: a
    later request with the key of an earlier one replays it. The ledger is
    read once for the whole batch (about ten queries whatever its size) and
    written in three statements, which is what lets the API commit many
    concurrent submissions together (`jobs.api.fast_ingest`). A refusal is one of
    `REFUSALS`. Should a write fail all the same (a constraint no check
    could foresee), nothing of the batch is kept and each request is
    submitted again alone, so that only the one at fault fails.
    """
    if not requests:
        return []
    try:
        with transaction.atomic():
            return _submit_together(requests)
    except DatabaseError:
        if len(requests) == 1:
            raise
    return [_submit_alone(request) for request in requests]


def _submit_alone(request: SubmissionRequest) -> Submission | Exception:
    try:
        with transaction.atomic():
            return _submit_together([request])[0]
    except DatabaseError as error:
        return error


def _submit_together(requests: Sequence[SubmissionRequest]) -> list[Submission | Exception]:
    """The batch in the current transaction; a request repeating an earlier one's key waits for a second round."""
    first, again = split_repeated_keys(requests)
    outcomes = dict(zip(first, _submit_round([requests[i] for i in first]), strict=True))
    if again:
        # The rows of the first round are visible here, so these replay (or clash with) them as a retry would.
        outcomes.update(zip(again, _submit_together([requests[i] for i in again]), strict=True))
    return [outcomes[index] for index in range(len(requests))]


def submission_errors(
    *,
    actor: Actor,
    project: Project | None,
    items: Sequence[Mapping[str, Any]],
    refused: Sequence[Collection[str]] = (),
    bulk: bool = False,
) -> FieldErrors:
    """Return every rule `items` break, by field path as `submit` names them; write nothing.

    For an interface that could not parse every field: `refused[i]` names
    the fields of `items[i]` it refused (and left out), which stand in as
    `drafts` says, so the answer holds every rule, database rules included,
    of the fields it did parse. Without a `project` (the interface could not
    read it either) only the field rules apply. Raises PermissionDenied or
    Http404 where `submit` would: who may submit comes before every rule.
    """
    return dry_run(actor=actor, project=project, items=items, refused=refused, bulk=bulk)[0]


def dry_run(
    *,
    actor: Actor,
    project: Project | None,
    items: Sequence[Mapping[str, Any]],
    refused: Sequence[Collection[str]] = (),
    bulk: bool = False,
) -> tuple[FieldErrors, list[WorkloadSpec]]:
    """Return `submission_errors`' answer and, when it is empty, the specs `submit` would write, in item order
    (with what the checks fill in, such as the quota's runtime); write nothing. Raises as `submission_errors`."""
    if project is None:
        return _field_errors(items, refused, bulk=bulk), []
    request = SubmissionRequest(actor=actor, project=project, items=items, bulk=bulk, refused=refused)
    pending = Pending(request)
    # The same steps as a submission's, in a transaction of their own: count limits may lock quota rows.
    with transaction.atomic():
        _checked([pending])
    if isinstance(pending.outcome, ValidationError):
        return _errors_of(pending.outcome), []
    if isinstance(pending.outcome, Exception):
        raise pending.outcome  # a refusal of who may submit
    return {}, pending.specs  # no rule broken (without a key nothing is replayed)


def _field_errors(items: Sequence[Mapping[str, Any]], refused: Sequence[Collection[str]], *, bulk: bool) -> FieldErrors:
    """Return the field rules each item breaks (no database), under `items[i].` in a bulk."""
    errors: FieldErrors = {}
    for index, data in enumerate(items):
        found = draft(data, refused=refused[index] if refused else ()).errors
        if found:
            error = ValidationError(found)
            errors.update(_errors_of(prefixed(error, f"items[{index}].") if bulk else error))
    return errors


def _errors_of(error: ValidationError) -> FieldErrors:
    return error.error_dict if hasattr(error, "error_dict") else {"non_field_errors": error.error_list}


def _submit_round(requests: Sequence[SubmissionRequest]) -> list[Submission | Exception]:
    """Submit requests that share no idempotency key, in the order of the module's docstring."""
    everything = [Pending(request) for request in requests]
    insert(_checked(everything))
    outcomes: list[Submission | Exception] = []
    for item in everything:
        assert item.outcome is not None  # every request is refused, replayed or inserted by now
        outcomes.append(item.outcome)
    return outcomes


def _checked(everything: list[Pending]) -> list[Pending]:
    """Run steps 1 to 6 over the requests; return those that break no rule and are no replay, writing nothing."""
    pending = check_submitters(everything)
    pending = check_each(pending, check_input)
    pending = check_images(pending)
    pending = lock_limits(pending)
    pending = replays(pending)
    pending = check_limits(pending)
    pending = check_placement(pending)
    pending = check_counts(pending)
    pending = check_budgets(pending)
    return refuse_invalid(pending)
