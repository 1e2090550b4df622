"""Tenant admins' page of launch presets: list, create, edit, delete.

The launch form (frontend.views.jobs) offers these presets to everyone in
the tenant; the rules are `jobs.services.presets`', whose errors land on the
form's fields. The page also lists the images the tenant may run, since a
preset's image must be one of them.
"""

from __future__ import annotations

import shlex
from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from frontend.access import Page, tenant_view
from frontend.views import attempt
from jobs import selectors
from jobs.choices import WorkloadKind
from jobs.models import LaunchPreset
from jobs.services import images, presets
from tenants.choices import Role
from tenants.selectors import tenant_quotas_in_scope


def _number(**kwargs: Any) -> forms.IntegerField:
    # No bounds here: the ranges are the service's, reported in its words.
    return forms.IntegerField(error_messages={"invalid": "Must be a whole number."}, **kwargs)


class PresetForm(forms.Form):
    """A launch preset, field for field the service's PresetValues; `command` is one line split as a shell would."""

    name = forms.CharField(max_length=63, strip=False, help_text="What members pick in the launch form.")
    description = forms.CharField(max_length=200, required=False)
    kind = forms.ChoiceField(choices=WorkloadKind.choices, initial=WorkloadKind.NOTEBOOK)
    image = forms.CharField(max_length=255, widget=forms.TextInput(attrs={"placeholder": "registry.local/jupyter:4"}))
    command = forms.CharField(
        required=False, help_text="Batch jobs: split into arguments as a shell would; empty runs the image's own."
    )
    pool = forms.ChoiceField(help_text="Pools the tenant holds quota in.")
    gpus_per_replica = _number(initial=1, label="GPUs per replica")
    replicas = _number(initial=1)
    cpu_milli = _number(initial=1000, label="CPU (millicores)")
    memory_mib = _number(initial=4096, label="Memory (MiB)")
    shm_mib = _number(required=False, label="Shared memory (MiB)", help_text="At most the memory; empty: 64 MiB.")
    idle_timeout_seconds = _number(
        required=False, label="Idle timeout (s)", help_text="Notebooks only; empty: the tenant's default."
    )
    max_runtime_seconds = _number(required=False, label="Max runtime (s)", help_text="Empty: the quota's maximum.")

    def __init__(self, *args: Any, pool_choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["pool"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = pool_choices

    def clean_command(self) -> list[str]:
        try:
            return shlex.split(self.cleaned_data["command"])
        except ValueError as error:
            raise ValidationError(f"Cannot split the command: {error}.", code="invalid") from None

    def values(self, page: Page) -> dict[str, Any]:
        """Return the cleaned fields as the service takes them, the pool resolved among the tenant's."""
        data = dict(self.cleaned_data)
        data["pool"] = _quota_pools(page)[data["pool"]]
        return data


def _quota_pools(page: Page) -> dict[str, Any]:
    return {quota.pool.name: quota.pool for quota in tenant_quotas_in_scope()}


def _initial(preset: LaunchPreset) -> dict[str, Any]:
    initial = {name: getattr(preset, name) for name in presets.PRESET_FIELDS}
    initial["pool"] = preset.pool.name
    initial["command"] = shlex.join(preset.command)
    return initial


@tenant_view(Role.ADMIN)
def presets_page(request: HttpRequest, page: Page) -> HttpResponse:
    pools = sorted(_quota_pools(page))
    data = request.POST if request.method == "POST" else None
    form = PresetForm(data, prefix="new", pool_choices=[(name, name) for name in pools])
    if form.is_valid() and attempt(
        form,
        lambda: presets.create_preset(
            actor=page.actor, tenant=page.tenant, values=presets.PresetValues(**form.values(page))
        ),
    ):
        messages.success(request, f"Preset {form.cleaned_data['name']} created.")
        return redirect("frontend:presets", tenant=page.tenant.slug)
    context = {
        "page": page,
        "presets": selectors.presets_for_tenant(),
        "images": selectors.allowed_images_for_tenant(page.tenant.pk),
        "images_enforced": images.policy_for_tenant(page.tenant.pk).enforced,
        "form": form,
    }
    return render(request, "frontend/presets.html", context)


@tenant_view(Role.ADMIN)
def preset_edit(request: HttpRequest, page: Page, pk: int) -> HttpResponse:
    preset = get_object_or_404(selectors.presets_for_tenant(), pk=pk)
    if request.method == "POST" and "delete" in request.POST:
        presets.delete_preset(actor=page.actor, preset=preset)
        messages.success(request, f"Preset {preset.name} deleted.")
        return redirect("frontend:presets", tenant=page.tenant.slug)
    pools = [(name, name) for name in sorted(_quota_pools(page))]
    data = request.POST if request.method == "POST" else None
    form = PresetForm(data, initial=_initial(preset), pool_choices=pools)
    if form.is_valid() and attempt(
        form, lambda: presets.update_preset(actor=page.actor, preset=preset, changes=form.values(page))
    ):
        messages.success(request, f"Preset {form.cleaned_data['name']} saved.")
        return redirect("frontend:presets", tenant=page.tenant.slug)
    return render(request, "frontend/preset_edit.html", {"page": page, "preset": preset, "form": form})
