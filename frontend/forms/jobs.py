"""Forms of the workload pages: launch and the workload list's filter."""

from __future__ import annotations

import shlex
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from frontend.forms.base import _choices
from inventory.models import NodePool
from jobs.choices import PriorityClass, WorkloadKind, WorkloadState
from jobs.models import LaunchPreset


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
