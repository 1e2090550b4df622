"""What a submission carries through its checks: the request, its items, the rules it breaks, its outcome."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404

from common.errors import Conflict, FieldErrors
from jobs.models import Workload
from jobs.services import quota_rules as rules
from jobs.services.spec import WorkloadSpec
from jobs.services.submission.drafts import Draft
from tenants.choices import Role
from tenants.context import Actor, RequestInfo
from tenants.models import Project


@dataclass(frozen=True)
class Submission:
    """What a submission returned: its workloads, and whether they were created now or replayed for a retried key."""

    workloads: list[Workload]
    created: bool


@dataclass(frozen=True)
class SubmissionRequest:
    """One submission of a batch (`submit_batch`): what `submit` takes, plus what its interface already knows.

    `role` is the actor's role in the project's tenant when the interface
    has read it for this request (None: read here); `info` is the request it
    came through, for the audit log (None: the request in progress).
    `refused` names, item by item, the fields its interface could not parse
    (left out of the item; `jobs.services.submission.drafts`); empty: none.
    """

    actor: Actor
    project: Project
    items: Sequence[Mapping[str, Any]]
    idempotency_key: str | None = None
    bulk: bool = False
    role: Role | None = None
    info: RequestInfo | None = None
    refused: Sequence[Collection[str]] = ()


# What refuses one submission of a batch without touching the others.
REFUSALS = (ValidationError, PermissionDenied, Http404, Conflict)


@dataclass
class Pending:
    """One request on its way through a batch; `outcome` is set once it is refused or replayed."""

    request: SubmissionRequest
    owner: User | None = None
    role: Role = Role.VIEWER  # the submitter's role in the tenant, once the first step has checked it
    drafts: list[Draft] = field(default_factory=list)
    # Every rule the request breaks so far, by field path (`items[2].image` in a bulk): refused at the end.
    errors: FieldErrors = field(default_factory=dict)
    limits: dict[int, rules.Limits] = field(default_factory=dict)
    digest: str = ""
    outcome: Submission | Exception | None = None

    @property
    def specs(self) -> list[WorkloadSpec]:
        """The items' specs; every item has one once the request is known to break no rule."""
        return [d.spec for d in self.drafts if d.spec is not None]

    @property
    def project(self) -> Project:
        return self.request.project

    @property
    def user(self) -> User:
        assert self.owner is not None  # set by the first step, which refuses requests without one
        return self.owner


def check_each(pending: list[Pending], check: Callable[[Pending], None]) -> list[Pending]:
    """Run `check` on each request still in the running; return those it did not refuse."""
    kept: list[Pending] = []
    for item in pending:
        try:
            check(item)
        except REFUSALS as refusal:
            item.outcome = refusal
        else:
            kept.append(item)
    return kept
