"""One item of a submission as far as its fields follow their own rules, for the rules that read the database.

Every item is held to its field rules first (`jobs.services.spec`). The
rules that read the database (the pool open to the tenant, the image
allow-list, the project's quota and limits, placement, count limits) then
run on the fields that passed theirs, so that one answer names every field
that fails, whatever rule it fails.

A field that broke its rule (or that the interface could not parse) is
replaced by its most lenient stand-in: the value under which no database
rule can fail on its account (no GPUs, one replica, any GPU model, the
quota's runtime, a batch job). So a database rule that fails on a draft
fails because of the fields that did pass, whatever the broken field is
corrected to. Without a pool no rule but the image's applies; without an
image the allow-list does not.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields
from typing import Any

from common.errors import FieldErrors
from inventory.models import NodePool
from jobs.choices import WorkloadKind
from jobs.services.spec import WorkloadSpec, field_of, parse

# The stand-in of each field a database rule reads; the other fields take their defaults, which no such rule reads.
_LENIENT: dict[str, Any] = {
    "name": "",
    "image": "",
    "kind": WorkloadKind.JOB,
    "gpus_per_replica": 0,
    "replicas": 1,
    "gpu_models": [],
    "max_runtime_seconds": None,
    "idle_timeout_seconds": None,
}
_SPEC_FIELDS = frozenset(f.name for f in fields(WorkloadSpec))


@dataclass(slots=True)
class Draft:
    """One item: `spec` when every field follows its rule, else with stand-ins for the `broken` fields.

    `spec` is None when the pool is broken; `image` is None when the image is.
    Only a draft with no `errors` is ever written. The checks change `spec`
    as they go: the quota's runtime filled in, or None once its pool is refused.
    """

    spec: WorkloadSpec | None
    image: str | None
    kind: str
    errors: FieldErrors
    broken: frozenset[str] = frozenset()


def draft(data: Mapping[str, Any], *, refused: Collection[str] = ()) -> Draft:
    """Return the item `data` describes, with every rule its fields break (`jobs.services.spec.parse`).

    `refused` names fields the interface could not parse (left out of `data`):
    they stand in leniently too, and are neither required nor reported here.
    """
    merged, errors = parse(data, refused=refused)
    if not errors and not refused:
        whole = WorkloadSpec(**merged)
        return Draft(spec=whole, image=whole.image, kind=whole.kind, errors=errors)
    broken = frozenset({field_of(path) for path in errors} | set(refused))
    values = {name: value for name, value in merged.items() if name in _SPEC_FIELDS and name not in broken}
    values.update((name, value) for name, value in _LENIENT.items() if name in broken)
    pool = values.get("pool")
    spec = WorkloadSpec(**{"name": "", "image": "", **values}) if isinstance(pool, NodePool) else None
    image = None if "image" in broken else values.get("image")
    return Draft(spec=spec, image=image, kind=values.get("kind", WorkloadKind.JOB), errors=errors, broken=broken)
