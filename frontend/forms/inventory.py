"""Forms of the operator's inventory pages: pools, nodes, GPUs and their filters."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from frontend.forms.base import _choices
from inventory.choices import GpuHealth, NodeKind, NodeState, PlacementPolicy, RuntimeKind
from inventory.models import DEFAULT_USAGE_HALF_LIFE_SECONDS, MAX_USAGE_HALF_LIFE_SECONDS


class PoolForm(forms.Form):
    name = forms.CharField(max_length=40)
    description = forms.CharField(max_length=2000, required=False)
    dedicated_tenant = forms.ChoiceField(required=False, label="Dedicated to tenant")
    placement_policy = forms.ChoiceField(choices=PlacementPolicy.choices, initial=PlacementPolicy.BINPACK)
    usage_half_life_seconds = forms.IntegerField(
        min_value=0,
        max_value=MAX_USAGE_HALF_LIFE_SECONDS,
        initial=DEFAULT_USAGE_HALF_LIFE_SECONDS,
        required=False,
        label="Usage half-life (seconds)",
        help_text="Past GPU use counts half in fair share after this long (empty: 7 days, 604800); 0: none counts.",
    )

    def __init__(self, *args: Any, tenant_choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "dedicated_tenant", [("", "— shared —"), *tenant_choices])

    def clean_usage_half_life_seconds(self) -> int:
        value = self.cleaned_data.get("usage_half_life_seconds")
        return DEFAULT_USAGE_HALF_LIFE_SECONDS if value is None else int(value)


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
    memory_mib = forms.IntegerField(min_value=0, required=False, label="Memory (MiB)")
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
        for name in ("cpu_cores", "memory_mib", "simulated_gpu_count"):
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
