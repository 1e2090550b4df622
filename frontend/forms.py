"""Forms of the web UI: input shapes only. The rules are the services', whose errors land on these fields."""

from __future__ import annotations

import re
import shlex
from decimal import Decimal
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from common.errors import Conflict
from inventory.choices import GpuHealth, NodeKind, NodeState, PlacementPolicy, RuntimeKind, VolumeKind
from inventory.models import NodePool
from jobs.choices import PriorityClass, WorkloadKind, WorkloadState
from jobs.models import LaunchPreset
from tenants.choices import MEMBERSHIP_ROLES, Role
from tenants.context import current_request_info
from tenants.services import login_locked_for


def _choices(form: forms.Form, name: str, choices: list[tuple[str, str]]) -> None:
    field = form.fields[name]
    assert isinstance(field, forms.ChoiceField)
    field.choices = choices


class LoginForm(AuthenticationForm):
    """The login form, refusing a locked (username, address) before looking at the password."""

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username") or ""
        locked = login_locked_for(username, current_request_info().source_ip)
        if locked:
            minutes = max(1, (locked + 59) // 60)
            raise ValidationError(f"Too many failed attempts; try again in {minutes} minutes.", code="locked")
        return super().clean()


class ProjectForm(forms.Form):
    slug = forms.CharField(max_length=40, help_text="Lowercase letters, digits and hyphens; permanent.")
    name = forms.CharField(max_length=120)
    description = forms.CharField(max_length=2000, required=False, widget=forms.Textarea(attrs={"rows": 2}))


class ProjectEditForm(forms.Form):
    name = forms.CharField(max_length=120)
    description = forms.CharField(max_length=2000, required=False, widget=forms.Textarea(attrs={"rows": 2}))


class InviteForm(forms.Form):
    username = forms.CharField(max_length=150)
    email = forms.EmailField(required=False)
    role = forms.ChoiceField(choices=MEMBERSHIP_ROLES, initial=Role.MEMBER)


class MemberForm(forms.Form):
    role = forms.ChoiceField(choices=MEMBERSHIP_ROLES)
    projects = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple)

    def __init__(self, *args: Any, project_choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "projects", project_choices)


class QuotaNumbersForm(forms.Form):
    guaranteed = forms.IntegerField(initial=0, label="Guaranteed GPUs")
    limit = forms.IntegerField(initial=0, label="Limit (GPUs)")
    weight = forms.IntegerField(initial=1)
    max_notebooks_per_user = forms.IntegerField(required=False, label="Max notebooks per user")
    max_pending_workloads = forms.IntegerField(required=False, label="Max pending workloads")
    max_runtime_seconds = forms.IntegerField(required=False, label="Max runtime (s)")


class TenantQuotaForm(QuotaNumbersForm):
    pool = forms.ChoiceField()
    field_order = ["project", "pool"]

    def __init__(self, *args: Any, pool_choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "pool", pool_choices)


class ProjectQuotaForm(TenantQuotaForm):
    project = forms.ChoiceField()

    def __init__(self, *args: Any, project_choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "project", project_choices)


class TokenForm(forms.Form):
    name = forms.CharField(max_length=80)
    role = forms.ChoiceField()
    expires_in_days = forms.IntegerField(
        initial=90, min_value=1, max_value=settings.API_TOKEN_MAX_DAYS, label="Expires in (days)"
    )

    def __init__(self, *args: Any, role_choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "role", role_choices)


class TenantForm(ProjectForm):
    """A new tenant has the same parts as a new project: a permanent slug, a name, a description."""


class PoolForm(forms.Form):
    name = forms.CharField(max_length=40)
    description = forms.CharField(max_length=2000, required=False)
    dedicated_tenant = forms.ChoiceField(required=False, label="Dedicated to tenant")
    placement_policy = forms.ChoiceField(choices=PlacementPolicy.choices, initial=PlacementPolicy.BINPACK)

    def __init__(self, *args: Any, tenant_choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "dedicated_tenant", [("", "— shared —"), *tenant_choices])


class NodeForm(forms.Form):
    """A node to register. Labels are typed as `key=value` lines; empty numbers mean 0 (unknown until probed)."""

    name = forms.CharField(max_length=63, help_text="The name its agent reports with: gpucloud agent --node NAME.")
    pool = forms.ChoiceField()
    kind = forms.ChoiceField(choices=NodeKind.choices, initial=NodeKind.BARE_METAL)
    runtime = forms.ChoiceField(
        choices=RuntimeKind.choices,
        initial=RuntimeKind.DOCKER,
        help_text="Docker isolates workloads; local processes are not isolated; simulated nodes exist only here.",
    )
    address = forms.CharField(max_length=255, required=False, help_text="Host name or IP other nodes reach it at.")
    cpu_cores = forms.IntegerField(min_value=0, required=False, label="CPU cores")
    memory_mb = forms.IntegerField(min_value=0, required=False, label="Memory (MiB)")
    simulated_gpu_count = forms.IntegerField(min_value=0, required=False, label="Simulated GPUs")
    simulated_gpu_model = forms.CharField(
        max_length=100,
        required=False,
        label="Simulated GPU model",
        widget=forms.TextInput(attrs={"placeholder": "NVIDIA H100 80GB HBM3"}),
    )
    labels = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "zone=a\nrack=r12"}),
        help_text="One key=value per line.",
    )

    def __init__(
        self, *args: Any, pool_choices: list[tuple[str, str]], agent_names: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "pool", pool_choices)
        if agent_names:
            self.fields["name"].widget.attrs["list"] = "unknown-agents"
        # Shown (and sent) only while the runtime is "simulated"; see app.js.
        only_simulated = f"{self.add_prefix('runtime')}={RuntimeKind.SIMULATED}"
        for name in ("simulated_gpu_count", "simulated_gpu_model"):
            self.fields[name].widget.attrs["data-only-with"] = only_simulated

    def clean_labels(self) -> dict[str, str]:
        labels: dict[str, str] = {}
        for number, line in enumerate(self.cleaned_data["labels"].splitlines(), start=1):
            if not line.strip():
                continue
            key, equals, value = line.partition("=")
            if not equals or not key.strip():
                raise ValidationError(f"Line {number}: write key=value.", code="invalid")
            labels[key.strip()] = value.strip()
        return labels

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        for name in ("cpu_cores", "memory_mb", "simulated_gpu_count"):
            if name in cleaned and cleaned[name] is None:
                cleaned[name] = 0
        return cleaned


class PoolFilterForm(forms.Form):
    pool = forms.ChoiceField(required=False)

    def __init__(self, *args: Any, pool_choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "pool", [("", "Any pool"), *pool_choices])

    def filters(self) -> dict[str, str]:
        """Return the chosen filters by name; none when the query string is not one the form offers."""
        return {name: value for name, value in self.cleaned_data.items() if value} if self.is_valid() else {}


class NodeFilterForm(PoolFilterForm):
    state = forms.ChoiceField(required=False, choices=[("", "Any state"), *NodeState.choices])


class GpuFilterForm(PoolFilterForm):
    health = forms.ChoiceField(required=False, choices=[("", "Any health"), *GpuHealth.choices])


class ReasonForm(forms.Form):
    """Why an operator changes a node's state; the service says when a reason is required."""

    reason = forms.CharField(max_length=2000, required=False, widget=forms.Textarea(attrs={"rows": 2}))


class RetireForm(ReasonForm):
    confirm = forms.BooleanField(label="Yes, take this node out of the cloud for good")


# A service names a part of a field as `env.NAME` or `command[2]`: the part's error belongs to the field.
_FIELD_PART = re.compile(r"[.\[]")


def apply_service_errors(form: forms.Form, error: ValidationError | Conflict) -> None:
    """Put a service's error on the form: each field's messages next to that field (a part's next to
    its field), the rest on top."""
    if isinstance(error, Conflict):
        form.add_error(None, error.message)
        return
    if not hasattr(error, "error_dict"):
        form.add_error(None, error)
        return
    for field, errors in error.error_dict.items():
        owner = _FIELD_PART.split(field, maxsplit=1)[0]
        if owner in form.fields:
            form.add_error(owner, errors)
        else:
            form.add_error(None, [f"{field}: {message}" for e in errors for message in e.messages])


def _whole_number(**kwargs: Any) -> forms.IntegerField:
    # No bounds here: the ranges are the service's, reported in its words as the API reports them.
    return forms.IntegerField(error_messages={"invalid": "Must be a whole number."}, **kwargs)


class LaunchForm(forms.Form):
    """A workload to submit, field for field the API's input; `command` is one line split as a shell would."""

    kind = forms.ChoiceField(choices=WorkloadKind.choices, initial=WorkloadKind.JOB)
    name = forms.CharField(help_text="Lowercase letters, digits and hyphens.")
    project = forms.ChoiceField()
    pool = forms.ChoiceField()
    image = forms.CharField(widget=forms.TextInput(attrs={"placeholder": "registry.example.com/team/train:1.0"}))
    command = forms.CharField(
        required=False,
        widget=forms.TextInput(attrs={"placeholder": "python train.py --epochs 3"}),
        help_text="Split into arguments as a shell would; empty runs the image's own command.",
    )
    gpus_per_replica = _whole_number(initial=1, label="GPUs per replica")
    replicas = _whole_number(initial=1, help_text="More than one runs a gang: all replicas start together.")
    cpu_milli = _whole_number(initial=1000, label="CPU (millicores)", help_text="1000 is one core.")
    memory_mib = _whole_number(initial=4096, label="Memory (MiB)")
    priority_class = forms.ChoiceField(choices=PriorityClass.choices, initial=PriorityClass.NORMAL, label="Priority")
    max_runtime_seconds = _whole_number(
        required=False, label="Max runtime (s)", help_text="Empty: the most the project's quota allows."
    )
    env = forms.CharField(
        required=False,
        label="Environment",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "EPOCHS=3\nWANDB_MODE=offline"}),
        help_text="One KEY=VALUE per line.",
    )
    # A fresh key per rendered form: submitting it twice (a double click, a resent POST) launches once.
    idempotency_key = forms.CharField(widget=forms.HiddenInput, required=False)
    # The preset the form was filled from: the workload records it and takes its idle timeout.
    preset = forms.CharField(widget=forms.HiddenInput, required=False)

    def __init__(
        self, *args: Any, project_choices: list[tuple[str, str]], pool_choices: list[tuple[str, str]], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "project", project_choices)
        _choices(self, "pool", pool_choices)
        # Notebooks run Jupyter: the command is shown (and sent) only for batch jobs; see app.js.
        self.fields["command"].widget.attrs["data-only-with"] = f"{self.add_prefix('kind')}={WorkloadKind.JOB}"

    def clean_command(self) -> list[str]:
        try:
            return shlex.split(self.cleaned_data["command"])
        except ValueError as error:
            raise ValidationError(f"Cannot split the command: {error}.", code="invalid") from None

    def clean_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for number, line in enumerate(self.cleaned_data["env"].splitlines(), start=1):
            if not line.strip():
                continue
            key, equals, value = line.partition("=")
            key = key.strip()
            if not equals or not key:
                raise ValidationError(f"Line {number}: write KEY=VALUE.", code="invalid")
            if key in env:
                raise ValidationError(f"Line {number}: {key} is set twice.", code="duplicate")
            env[key] = value
        return env

    def workload_data(self, pool: NodePool, preset: LaunchPreset | None = None) -> dict[str, Any]:
        """Return the cleaned input as the submission service takes it (project and key go separately)."""
        data = {k: v for k, v in self.cleaned_data.items() if k not in ("project", "idempotency_key", "preset")}
        return {**data, "pool": pool, **({"preset": preset} if preset is not None else {})}


class WorkloadFilterForm(forms.Form):
    state = forms.ChoiceField(required=False, choices=[("", "Any state"), *WorkloadState.choices])
    project = forms.ChoiceField(required=False)
    kind = forms.ChoiceField(required=False, choices=[("", "Any kind"), *WorkloadKind.choices])
    mine = forms.BooleanField(required=False, label="Only mine")

    def __init__(self, *args: Any, project_choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "project", [("", "Any project"), *project_choices])

    def filters(self) -> dict[str, Any]:
        """Return the chosen filters by name (`mine` as True); none when the query string is not one the form offers."""
        return {name: value for name, value in self.cleaned_data.items() if value} if self.is_valid() else {}


# --- storage -----------------------------------------------------------------------

GIB = 1024**3


class _ProjectChoiceForm(forms.Form):
    """A form with a `project` choice among the tenant's projects, given when it is made (`blank_project`: "—" too)."""

    blank_project = False

    def __init__(self, *args: Any, project_choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["project"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [("", "—"), *project_choices] if self.blank_project else project_choices


def _gib(**kwargs: Any) -> forms.DecimalField:
    # No upper bound here: ranges are the services', reported in their words.
    return forms.DecimalField(
        required=False, min_value=0, decimal_places=3, help_text="GiB; empty: no limit.", **kwargs
    )


def gib_to_bytes(gib: Decimal | None) -> int | None:
    """Return a size entered in GiB as bytes (None: no limit)."""
    return None if gib is None else int(gib * GIB)


class VolumeForm(_ProjectChoiceForm):
    kind = forms.ChoiceField(choices=[(VolumeKind.PROJECT, "Project volume"), (VolumeKind.DATASET, "Dataset")])
    name = forms.CharField(max_length=40, help_text="Mounted at /projects/<name> or /datasets/<name>.")
    project = forms.ChoiceField(required=False, help_text="A dataset without one is the tenant's.")
    description = forms.CharField(max_length=200, required=False)
    size_limit_bytes = _gib(label="Size limit")

    blank_project = True


class TenantStorageForm(forms.Form):
    storage_limit_bytes = _gib(label="Tenant storage quota")
    home_limit_bytes = _gib(label="Home limit (each member)")


class ProjectStorageForm(_ProjectChoiceForm):
    project = forms.ChoiceField()
    storage_limit_bytes = _gib(label="Project storage quota")


class VolumeEditForm(forms.Form):
    description = forms.CharField(max_length=200, required=False)
    size_limit_bytes = _gib(label="Size limit")


class ShareForm(_ProjectChoiceForm):
    project = forms.ChoiceField()
    read_only = forms.BooleanField(required=False, initial=True, label="Read-only")


class UploadForm(forms.Form):
    file = forms.FileField()


class FolderForm(forms.Form):
    path = forms.CharField(max_length=4096, strip=False, label="New folder", help_text="Inside this folder.")
