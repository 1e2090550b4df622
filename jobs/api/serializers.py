"""Serializers of the jobs API: input shapes (types only) and output shapes. Rules live in jobs.services."""

from __future__ import annotations

import dataclasses
from operator import attrgetter
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from common.api.fields import Integer, ObjectId
from common.api.types import MAX_ITEMS, MAX_TEXT
from inventory.selectors import pools_open_to_tenant
from jobs.choices import PriorityClass, WorkloadKind, WorkloadState
from jobs.models import Allocation, Workload, WorkloadEvent
from jobs.selectors import LaunchStep, current_launch_steps, presets_for_tenant
from jobs.services.available import ACTIONS, available_actions
from jobs.services.hibernation import notebook_link
from tenants.api.fields import GpuLimitField, ScopedSlugField
from tenants.selectors import projects_in_scope


# Nodes also have fields named `kind` and `state`: ENUM_NAME_OVERRIDES (settings) gives the workload's
# enums names of their own, so both sides keep a real enum in the schema.
class WorkloadKindField(serializers.ChoiceField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=WorkloadKind.choices, **kwargs)


class WorkloadStateField(serializers.ChoiceField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=WorkloadState.choices, **kwargs)


@extend_schema_field(
    {
        "oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "string"}],
        "description": "The arguments, or one line split into arguments as a shell would (as the launch page "
        'splits it): `"python train.py --lr 0.1"` is `["python", "train.py", "--lr", "0.1"]`. '
        "Left out: the image's own command.",
    }
)
class CommandField(serializers.Field):
    """A command as a list of strings or as one line; the line is passed on as sent and the service splits it.

    The service splits it (`jobs.services.spec.split_command`), so the API,
    the launch page and the ingest read a line the same way.
    """

    def to_internal_value(self, data: Any) -> str | list[str]:
        if isinstance(data, str):
            return data  # its length is bounded with every string's (common.api.types)
        if not isinstance(data, list):
            raise serializers.ValidationError("Must be a list of strings or one string.", code="invalid")
        if len(data) > MAX_ITEMS:
            raise serializers.ValidationError(f"At most {MAX_ITEMS} items.", code="invalid")
        errors: dict[Any, list[str]] = {i: [_argument_error(p)] for i, p in enumerate(data) if _argument_error(p)}
        if errors:
            raise serializers.ValidationError(errors, code="invalid")  # by index, as a ListField reports
        return data

    def to_representation(self, value: Any) -> Any:
        return value


def _argument_error(part: Any) -> str:
    if not isinstance(part, str):
        return "Must be a string."
    return f"At most {MAX_TEXT} characters." if len(part) > MAX_TEXT else ""


def _projects(context: dict[str, Any]) -> Any:
    # With its tenant: the submission service checks the submitter's role there without another query.
    return projects_in_scope().select_related("tenant")


def _open_pools(context: dict[str, Any]) -> Any:
    return pools_open_to_tenant(context["tenant"].pk)


class WorkloadItemSerializer(serializers.Serializer):
    """One workload to submit; the pool is a name among those the tenant may use.

    `preset` (a launch preset's id) fills in every field the item leaves out;
    without one, the defaults are the service's (kind job, 1 GPU, ...). So
    that the two can be told apart, fields left out stay out of the data.
    """

    preset = ObjectId(required=False, help_text="A launch preset's id: its fields are defaults.")
    kind = WorkloadKindField(required=False)
    name = serializers.CharField(max_length=63)
    image = serializers.CharField(max_length=255, required=False)
    command = CommandField(required=False)
    env = serializers.DictField(child=serializers.CharField(allow_blank=True, trim_whitespace=False), required=False)
    gpus_per_replica = Integer(required=False, help_text="Default 1.")
    replicas = Integer(required=False, help_text="Default 1.")
    gpu_models = serializers.ListField(child=serializers.CharField(), required=False)
    pool = serializers.CharField(max_length=40, required=False)
    cpu_milli = Integer(required=False, help_text="Default 1000.")
    memory_mib = Integer(required=False, help_text="Default 4096.")
    shm_mib = Integer(
        required=False,
        allow_null=True,
        help_text="The size of /dev/shm, at most memory_mib. Default (null): the runtime's, 64 MiB on Docker.",
    )
    priority_class = serializers.ChoiceField(choices=PriorityClass.choices, required=False)
    max_runtime_seconds = Integer(required=False, allow_null=True, help_text="Default: the quota's maximum.")
    requeue_limit = Integer(required=False, help_text="Default 3.")
    stop_signal = serializers.CharField(
        max_length=10,
        required=False,
        help_text="Sent first on a stop, then SIGKILL after the grace period. Default SIGTERM.",
    )


def prefetch_references(context: dict[str, Any], items: list[dict[str, Any]]) -> dict[str, Any]:
    """Return `context` with the tenant's pools and presets that `items` name read in one query each.

    `resolve_references` then reads them from there: the submission ingest
    resolves a whole batch of one tenant's submissions with two queries, by
    the same selectors and the same rule as a single request. Run inside the
    tenant's scope.
    """
    names = {item["pool"] for item in items if "pool" in item}
    ids = {item["preset"] for item in items if "preset" in item}
    pools = {p.name: p for p in _open_pools(context).filter(name__in=names)} if names else {}
    presets = {p.pk: p for p in presets_for_tenant().filter(pk__in=ids)} if ids else {}
    return {**context, "pools": pools, "presets": presets}


def resolve_references(items: list[dict[str, Any]], context: dict[str, Any], prefix: str) -> None:
    """Replace each item's pool name and preset id by the tenant's object; raise naming every one that is not.

    A pool the tenant may not use and another tenant's preset read as
    missing. Reads what `prefetch_references` put in `context`, else
    prefetches (one query each). `prefix` formats an item's field path.
    """
    if "pools" not in context:
        context = prefetch_references(context, items)
    errors: dict[str, list[str]] = {}
    for index, item in enumerate(items):
        where = prefix.format(index=index)
        if "pool" in item:
            name, item["pool"] = item["pool"], context["pools"].get(item["pool"])
            if item["pool"] is None:
                errors[f"{where}pool"] = [f"No pool named {name}."]
        if "preset" in item:
            item["preset"] = context["presets"].get(item["preset"])
            if item["preset"] is None:
                errors[f"{where}preset"] = ["No such launch preset in this tenant."]
    if errors:
        raise serializers.ValidationError(errors, code="does_not_exist")


class WorkloadInputSerializer(WorkloadItemSerializer):
    """A single submission: one workload in one of the tenant's projects."""

    project = ScopedSlugField(selector=_projects)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        resolve_references([attrs], self.context, "")
        return attrs


class BulkInputSerializer(serializers.Serializer):
    """Many workloads into one project at once: all are accepted or none."""

    project = ScopedSlugField(selector=_projects)
    items = WorkloadItemSerializer(many=True, allow_empty=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs["items"] = [dict(item) for item in attrs["items"]]
        resolve_references(attrs["items"], self.context, "items[{index}].")
        return attrs


_WORKLOAD_FIELDS = [
    "id",
    "name",
    "kind",
    "state",
    "project",
    "pool",
    "owner",
    "image",
    "command",
    "env",
    "gpus_per_replica",
    "replicas",
    "gpu_models",
    "cpu_milli",
    "memory_mib",
    "shm_mib",
    "priority_class",
    "max_runtime_seconds",
    "requeue_limit",
    "stop_signal",
    "attempt",
    "reason_code",
    "reason_message",
    "reason_hint",
    "queue_position",
    "exit_code",
    "submitted_at",
    "scheduled_at",
    "started_at",
    "finished_at",
    "checkpointed_at",
    "lost_gpu_seconds",
    "preemptions",
    "predicted_runtime_seconds",
    "prediction_basis",
    "run_seconds",
    "prediction_error",
    "estimated_start_at",
    "estimate_basis",
    "reservation",
]

RESERVATION_SCHEMA = {
    "type": "object",
    "nullable": True,
    "description": "GPUs the scheduler holds for it while it waits, from `from` on; null: none.",
    "required": ["from", "replicas"],
    "properties": {
        "from": {"type": "string", "format": "date-time"},
        "replicas": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["node", "gpus"],
                "properties": {"node": {"type": "string"}, "gpus": {"type": "array", "items": {"type": "string"}}},
            },
        },
    },
}


class WorkloadSerializer(serializers.ModelSerializer):
    project: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    pool: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="name", read_only=True)
    owner = serializers.CharField(source="owner.username", read_only=True)
    kind = WorkloadKindField(read_only=True)
    state = WorkloadStateField(read_only=True)
    reservation = serializers.SerializerMethodField()

    class Meta:
        model = Workload
        fields = _WORKLOAD_FIELDS
        read_only_fields = fields

    @extend_schema_field(RESERVATION_SCHEMA)
    def get_reservation(self, workload: Workload) -> dict[str, Any] | None:
        return _reservation(workload)


class AllocationSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name", read_only=True)
    gpu_index = Integer(source="gpu.index", read_only=True, allow_null=True, default=None)
    gpu_uuid = serializers.CharField(source="gpu.uuid", read_only=True, allow_null=True, default=None)
    gpu_model = serializers.CharField(source="gpu.model", read_only=True, allow_null=True, default=None)

    class Meta:
        model = Allocation
        fields = ["replica", "node", "gpu_index", "gpu_uuid", "gpu_model", "created_at", "released_at"]
        read_only_fields = fields


class WorkloadEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = WorkloadEvent
        fields = ["kind", "from_state", "to_state", "reason_code", "message", "created_at"]
        read_only_fields = fields


_WHEN = {"type": "string", "format": "date-time", "nullable": True}
LAUNCH_STEP_SCHEMA = {
    "type": "array",
    "description": "The current attempt's launch, as the workload's page shows it ([] once it has ended).",
    "items": {
        "type": "object",
        "required": ["key", "label", "detail", "status", "at", "due"],
        "properties": {
            "key": {"type": "string"},
            "label": {"type": "string"},
            "detail": {"type": "string"},
            "status": {"type": "string", "enum": ["done", "current", "next"]},
            "at": {**_WHEN, "description": "When it was reached; null: not yet."},
            "due": {**_WHEN, "description": "While waiting for GPUs: when some come back at the latest."},
        },
    },
}


def _launch_step(step: LaunchStep) -> dict[str, Any]:
    when = serializers.DateTimeField()
    at = when.to_representation(step.at) if step.at else None
    due = when.to_representation(step.due) if step.due else None
    return {**dataclasses.asdict(step), "at": at, "due": due}


class WorkloadDetailSerializer(WorkloadSerializer):
    """A workload with where it runs (allocations), what happened to it (events) and how far its launch got.

    `notebook_url` (a path on the console) is set for a running notebook when
    the caller may open it (`jobs.selectors.may_open_notebook`); `actions` names
    what the caller may do to it now (`available_actions`). The view puts the
    viewer in the context as `viewer_id` and `viewer_role` (the role it acts with).
    """

    allocations = AllocationSerializer(many=True, read_only=True)
    events = WorkloadEventSerializer(many=True, read_only=True)
    launch_steps = serializers.SerializerMethodField()
    notebook_url = serializers.SerializerMethodField()
    actions = serializers.SerializerMethodField()

    class Meta(WorkloadSerializer.Meta):
        fields = [*_WORKLOAD_FIELDS, "lab_path", "allocations", "events", "launch_steps", "notebook_url", "actions"]
        read_only_fields = fields

    @extend_schema_field(LAUNCH_STEP_SCHEMA)
    def get_launch_steps(self, workload: Workload) -> list[dict[str, Any]]:
        return [_launch_step(step) for step in current_launch_steps(workload, now=timezone.now())]

    @extend_schema_field({"type": "string", "nullable": True, "description": "Where its JupyterLab opens, or null."})
    def get_notebook_url(self, workload: Workload) -> str | None:
        return notebook_link(
            workload,
            viewer_id=self.context.get("viewer_id"),
            role=self.context.get("viewer_role"),
        )

    @extend_schema_field(
        {
            "type": "array",
            "items": {"type": "string", "enum": list(ACTIONS)},
            "description": "What the caller may do to it now: each name but `open` is `POST .../workloads/<id>/<name>/`"
            " (`cancel` stops a started workload); `open` means `notebook_url` is set.",
        }
    )
    def get_actions(self, workload: Workload) -> list[str]:
        return available_actions(
            workload, role=self.context.get("viewer_role"), viewer_id=self.context.get("viewer_id")
        )


class ValidationResultSerializer(serializers.Serializer):
    """A dry run's answer: the submission meets every rule (a refusal is the 400 error envelope)."""

    valid = serializers.BooleanField(read_only=True)
    count = Integer(read_only=True, help_text="Workloads that would be submitted.")
    budget_notes = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text='What the budgets over the project say: "This job may use up to N of your remaining M GPU-hours".',
    )


class QuotaUseSerializer(serializers.Serializer):
    """GPUs in use in one pool against a quota: the tenant's own (project null) or a project's."""

    project = serializers.CharField(read_only=True, allow_null=True, help_text="null: the tenant's own quota.")
    pool = serializers.CharField(read_only=True)
    guaranteed = Integer(read_only=True)
    limit = GpuLimitField(help_text="null: no limit at this level.")
    in_use = Integer(read_only=True, help_text="GPUs held now.")
    borrowed = Integer(read_only=True, help_text="GPUs held above the guarantee, reclaimable.")
    running = Integer(read_only=True, help_text="Workloads placed, starting or running.")
    pending = Integer(read_only=True, help_text="Workloads waiting.")


class UsageSerializer(serializers.Serializer):
    quotas = QuotaUseSerializer(many=True, read_only=True)


class BulkResultSerializer(serializers.Serializer):
    """The workloads of a bulk submission, in the order submitted."""

    count = Integer(read_only=True)
    results = WorkloadSerializer(many=True, read_only=True)


# --- submission responses ---------------------------------------------------------------

_DATETIME = serializers.DateTimeField()
# Fields WorkloadSerializer renders from a related row, and those it renders through DateTimeField.
_RELATED = {"project": ("project", "slug"), "pool": ("pool", "name"), "owner": ("owner", "username")}
_DATETIMES = frozenset(
    {"submitted_at", "scheduled_at", "started_at", "finished_at", "checkpointed_at", "estimated_start_at"}
)


def _reservation(workload: Workload) -> dict[str, Any] | None:
    """Return a workload's reservation as the API shows it, or None when it holds none."""
    if workload.reserved_from is None:
        return None
    return {"from": _DATETIME.to_representation(workload.reserved_from), "replicas": workload.reserved_gpus}


def _path(name: str) -> str:
    if name in _RELATED:
        return ".".join(_RELATED[name])
    # Rendered from the workload itself (`_reservation`); read here only to keep the fields' order.
    if name == "reservation":
        return "reserved_from"
    return "pk" if name == "id" else name


# Every field of a row read in one call (in C), in the serializer's order.
_ROW_VALUES = attrgetter(*(_path(name) for name in _WORKLOAD_FIELDS))
_DATETIME_AT = [index for index, name in enumerate(_WORKLOAD_FIELDS) if name in _DATETIMES]
_RESERVATION_AT = _WORKLOAD_FIELDS.index("reservation")


def workload_rows(workloads: list[Workload]) -> list[dict[str, Any]]:
    """Return what `WorkloadSerializer(workloads, many=True).data` holds, without its per-field machinery.

    Submissions answer with up to 2,000 workloads just written, their
    project, pool and owner already loaded: building the serializer's
    fields and walking them per row costs more than the rest of a small
    submission. tests/jobs/test_submission.py holds the two to the same output.
    """
    rendered: dict[Any, Any] = {None: None}  # submitted_at is one value for a whole submission: format it once
    rows = []
    for workload in workloads:
        values = list(_ROW_VALUES(workload))
        for index in _DATETIME_AT:
            value = values[index]
            if value not in rendered:
                rendered[value] = _DATETIME.to_representation(value)
            values[index] = rendered[value]
        values[_RESERVATION_AT] = _reservation(workload)
        # Choices are str subclasses (TextChoices); the renderer wants their plain value.
        rows.append(
            {name: str(v) if isinstance(v, str) else v for name, v in zip(_WORKLOAD_FIELDS, values, strict=True)}
        )
    return rows
