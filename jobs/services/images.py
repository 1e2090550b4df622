"""Allowed images: the patterns operators allow, and the submission rule that enforces them.

A pattern is an image reference in which `*` (any run of characters,
`/` and `:` included) and `?` (any one character) are wildcards, matched
case-sensitively as shell patterns: `registry.local/pytorch:*` allows every
tag of one image, `registry.local/*` every image of one registry. A pattern
belongs to one tenant, or to every tenant when it has none; `notebook`
marks images that can serve a Jupyter session.

The allow-list is off on a fresh install: while no pattern exists anywhere
on the platform, every image is allowed. Once an operator adds any pattern,
an image is allowed for a tenant only when it matches one of the tenant's
patterns or a platform-wide one, and a notebook needs a `notebook` pattern.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from common.errors import FieldErrors, add_errors, invalid, raise_errors
from jobs import fast_sql
from jobs.choices import WorkloadKind
from jobs.models import AllowedImage
from jobs.services.spec import (
    IMAGE_RULE,
    MAX_IMAGE_LENGTH,
    WorkloadSpec,
    prefixed,
)
from tenants.context import Actor
from tenants.models import Tenant
from tenants.services.access import require_operator
from tenants.services.audit import delete_audited, record_audit_event, snapshot

IMAGE_FIELDS = ["tenant", "pattern", "notebook", "description"]
MAX_DESCRIPTION_LENGTH = 200
_WILDCARDS = re.compile(r"[*?]")


@dataclass(frozen=True)
class ImagePolicy:
    """The patterns that apply to one tenant; `enforced` is False while the platform has no pattern at all."""

    enforced: bool
    patterns: tuple[tuple[str, bool], ...] = ()

    def allows(self, image: str, *, notebook: bool) -> bool:
        """Return whether `image` may run (as a notebook when `notebook`)."""
        if not self.enforced:
            return True
        return any(fnmatch.fnmatchcase(image, pattern) for pattern, serves in self.patterns if serves or not notebook)

    def refusal(self, image: str, *, notebook: bool) -> tuple[str, str] | None:
        """Return the (rule, message) refusing `image`, or None when it may run."""
        if self.allows(image, notebook=notebook):
            return None
        if notebook and self.allows(image, notebook=False):
            return (
                "not_a_notebook_image",
                f"Image {image} is allowed for batch jobs only; notebooks need an image an operator marked as able "
                "to serve Jupyter.",
            )
        return ("image_not_allowed", f"Image {image} is not on this tenant's list of allowed images.")


def check_pattern(pattern: object) -> str:
    """Return `pattern` when it is an image reference with optional `*`/`?` wildcards; raise ValidationError."""
    if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_IMAGE_LENGTH:
        raise invalid("pattern", "invalid_pattern", f"Give an image pattern of 1 to {MAX_IMAGE_LENGTH} characters.")
    # A wildcard stands for at least one legal character: replacing each by a letter
    # must leave a valid reference, so `registry.local/pytorch:*` passes and `a b*` does not.
    if not IMAGE_RULE.fullmatch(_WILDCARDS.sub("x", pattern)):
        raise invalid(
            "pattern",
            "invalid_pattern",
            "Must be an image reference such as registry.example.com/team/train:1.0, with * (any characters) or "
            "? (one character) as wildcards: lower case, no spaces, no [ ].",
        )
    return pattern


def policy_for_tenant(tenant_id: int) -> ImagePolicy:
    """Return the image policy of one tenant, in one query."""
    return policies_for_tenants([tenant_id])[tenant_id]


def policies_for_tenants(tenant_ids: Collection[int]) -> dict[int, ImagePolicy]:
    """Return the image policy of each tenant in `tenant_ids`, in one query. Looks across tenants on
    purpose: whether the allow-list applies at all depends on whether any pattern exists anywhere."""
    ids = sorted(set(tenant_ids))
    # The tenants' and the platform-wide patterns, plus any one row (whoever's) so
    # the same query also says whether the platform has a pattern at all.
    rows = fast_sql.allowed_image_rows(ids) if ids else []
    return {
        tenant_id: ImagePolicy(
            enforced=bool(rows),
            patterns=tuple((pattern, notebook) for owner, pattern, notebook in rows if owner in (tenant_id, None)),
        )
        for tenant_id in ids
    }


def check_images(
    specs: Sequence[WorkloadSpec], tenant_id: int, *, bulk: bool, policy: ImagePolicy | None = None
) -> None:
    """Raise ValidationError on `image` (rules `image_not_allowed`, `not_a_notebook_image`) naming every item
    whose image the tenant may not run. One query for all items, none when the tenant's `policy` is given."""
    if policy is None:
        policy = policy_for_tenant(tenant_id)
    if not policy.enforced:
        return
    errors: FieldErrors = {}
    for index, spec in enumerate(specs):
        try:
            check_image_allowed(policy, spec.image, spec.kind)
        except ValidationError as error:
            add_errors(errors, prefixed(error, f"items[{index}].") if bulk else error)
    raise_errors(errors)


def check_image_allowed(policy: ImagePolicy, image: str, kind: str) -> None:
    """Raise ValidationError on `image` (rules `image_not_allowed`, `not_a_notebook_image`) unless `policy`
    lets the tenant run `image` as a workload of `kind`: the allow-list's one rule, for submissions and presets.
    """
    refusal = policy.refusal(image, notebook=kind == WorkloadKind.NOTEBOOK)
    if refusal is not None:
        raise invalid("image", *refusal)


@transaction.atomic
def create_allowed_image(
    *, actor: Actor, pattern: str, tenant: Tenant | None = None, notebook: bool = False, description: str = ""
) -> AllowedImage:
    """Allow `pattern` for `tenant` (every tenant when None) and return it; operators only.

    Raises PermissionDenied, or ValidationError on `pattern` (rules `invalid_pattern`, `unique`) or
    `description` (`too_long`).
    """
    require_operator(actor)
    check_pattern(pattern)
    if len(description) > MAX_DESCRIPTION_LENGTH:
        raise invalid("description", "too_long", f"At most {MAX_DESCRIPTION_LENGTH} characters.")
    image = AllowedImage(tenant=tenant, pattern=pattern, notebook=notebook, description=description)
    try:
        # A savepoint: a concurrent twin makes the insert fail without spoiling the caller's transaction.
        with transaction.atomic():
            image.save()
    except IntegrityError:
        where = f"tenant {tenant.slug}" if tenant is not None else "every tenant"
        raise invalid("pattern", "unique", f"{pattern} is already allowed for {where}.") from None
    record_audit_event(
        actor=actor,
        action="allowed_image.create",
        obj=image,
        tenant_id=image.tenant_id,
        after=snapshot(image, IMAGE_FIELDS),
    )
    return image


@transaction.atomic
def delete_allowed_image(*, actor: Actor, image: AllowedImage) -> None:
    """Remove an allowed image pattern; operators only. Workloads already submitted keep running.

    Raises PermissionDenied.
    """
    require_operator(actor)
    delete_audited(
        actor=actor, action="allowed_image.delete", obj=image, tenant_id=image.tenant_id, audited=IMAGE_FIELDS
    )
