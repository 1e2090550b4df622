"""Forms of the workload pages: launch and the workload list's filter."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError

from common.errors import Conflict
from frontend.forms.base import _choices, apply_service_errors
from inventory.models import NodePool
from jobs.choices import PriorityClass, WorkloadKind, WorkloadState
from jobs.models import LaunchPreset


def _whole_number(**kwargs: Any) -> forms.IntegerField:
    # No bounds here: the ranges are the service's, reported in its words as the API reports them.
    return forms.IntegerField(error_messages={"invalid": "Must be a whole number."}, **kwargs)


class LaunchForm(forms.Form):
    """A workload to submit, field for field the API's input.

    `command` is one line, which the service splits as a shell would (as it
    does a line sent to the API); `gpu_model` is one model or any, sent as
    `gpu_models`. The form only parses: the rules are the service's, and
    `workload_data` gives what parsed to it even when some field did not.
    """

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
    gpu_model = forms.ChoiceField(
        required=False, label="GPU model", help_text="Any: whichever model is free first in the pool."
    )
    replicas = _whole_number(initial=1, help_text="More than one runs a gang: all replicas start together.")
    cpu_milli = _whole_number(initial=1000, label="CPU (millicores)", help_text="1000 is one core.")
    memory_mib = _whole_number(initial=4096, label="Memory (MiB)")
    shm_mib = _whole_number(
        required=False,
        label="Shared memory (MiB)",
        help_text="For NCCL and data loaders; at most the memory. Empty: 64 MiB.",
    )
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
        self,
        *args: Any,
        project_choices: list[tuple[str, str]],
        pool_choices: list[tuple[str, str]],
        gpu_model_choices: list[tuple[str, str]],
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "project", project_choices)
        _choices(self, "pool", pool_choices)
        _choices(self, "gpu_model", [("", "Any model"), *gpu_model_choices])
        # Notebooks run Jupyter: the command is shown (and sent) only for batch jobs; see app.js.
        self.fields["command"].widget.attrs["data-only-with"] = f"{self.add_prefix('kind')}={WorkloadKind.JOB}"

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

    def workload_data(self, pool: NodePool | None, preset: LaunchPreset | None = None) -> dict[str, Any]:
        """Return the cleaned input as the submission service takes it (project and key go separately).

        Only the fields that cleaned are in it (all of them once the form is
        valid), and the pool and preset when given.
        """
        data = {k: v for k, v in self.cleaned_data.items() if k not in _NOT_SPEC}
        if "gpu_model" in self.cleaned_data:
            data["gpu_models"] = [self.cleaned_data["gpu_model"]] if self.cleaned_data["gpu_model"] else []
        if pool is not None:
            data["pool"] = pool
        return {**data, **({"preset": preset} if preset is not None else {})}

    def add_service_errors(self, error: ValidationError | Conflict) -> None:
        """Put a service's refusal on the form, its `gpu_models` errors next to the GPU model choice."""
        if isinstance(error, ValidationError) and hasattr(error, "error_dict") and "gpu_models" in error.error_dict:
            renamed = {_FORM_NAMES.get(name, name): found for name, found in error.error_dict.items()}
            error = ValidationError(renamed)
        apply_service_errors(self, error)

    def refused_fields(self) -> set[str]:
        """Return the service's names of the fields this form refused (its errors but those of the whole form)."""
        refused = set(self.errors) - {NON_FIELD_ERRORS}
        return refused | ({"gpu_models"} if "gpu_model" in refused else set())


# The form's name for a service's field where the two differ.
_FORM_NAMES = {"gpu_models": "gpu_model"}
# Fields of the form that are not a workload's: they go to the service separately, or under another name.
_NOT_SPEC = ("project", "idempotency_key", "preset", "gpu_model")


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
