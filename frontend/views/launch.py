"""The launch page: a notebook or a batch job from a preset or from scratch, submitted through
`jobs.services` exactly as the API submits it."""

from __future__ import annotations

import shlex
import uuid
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.utils.text import slugify

from common.errors import Conflict
from frontend import forms
from frontend.access import Page, tenant_view
from frontend.views.budgets import launch_notes_for_form
from inventory.models import NodePool
from inventory.selectors import pool_capacity, pools_open_to_tenant
from jobs import selectors as job_selectors
from jobs import services
from jobs.models import LaunchPreset, Workload
from jobs.services.submission import submission_errors
from tenants import selectors as tenant_selectors
from tenants.choices import Role
from tenants.models import Project


def _submittable_projects(page: Page) -> list[Project]:
    """Return the projects the viewer may submit into: any for tenant admins, else those they are on."""
    if page.is_admin:
        return list(tenant_selectors.projects_in_scope())
    user = page.actor.user
    return list(tenant_selectors.projects_of_member(user)) if user is not None else []


@dataclass(frozen=True)
class LaunchChoices:
    """What the viewer may launch with: projects they may submit into, the tenant's pools, presets and GPU models.

    `gpu_models` maps each GPU model present in the tenant's pools to the pools that have it.
    """

    projects: list[Project]
    pools: list[NodePool]
    presets: list[LaunchPreset]
    gpu_models: dict[str, list[str]]

    @classmethod
    def of(cls, page: Page) -> LaunchChoices:
        pools = list(pools_open_to_tenant(page.tenant.pk).order_by("name"))
        return cls(
            projects=_submittable_projects(page),
            pools=pools,
            presets=list(job_selectors.presets_for_tenant()),
            gpu_models=_gpu_models(pools),
        )

    def preset(self, pk: Any) -> LaunchPreset | None:
        return next((p for p in self.presets if str(p.pk) == str(pk)), None)

    def pool(self, name: Any) -> NodePool | None:
        return next((p for p in self.pools if p.name == name), None)

    def gpu_model_choices(self) -> list[tuple[str, str]]:
        """Return the GPU model choices, each labelled with the pools that have it."""
        return [(model, f"{model} (in {', '.join(pools)})") for model, pools in sorted(self.gpu_models.items())]


def _gpu_models(pools: list[NodePool]) -> dict[str, list[str]]:
    names = {pool.pk: pool.name for pool in pools}
    found: dict[str, list[str]] = {}
    for pool_id, models in pool_capacity(sorted(names)).items():
        for row in models:
            found.setdefault(row["model"], []).append(names[pool_id])
    return {model: sorted(in_pools) for model, in_pools in found.items()}


def preset_initial(preset: LaunchPreset) -> dict[str, Any]:
    """Return the launch form's values from `preset`; the name is made a valid workload name to start from."""
    return {
        "preset": preset.pk,
        "kind": preset.kind,
        "name": slugify(preset.name)[:63].strip("-"),
        "pool": preset.pool.name,
        "image": preset.image,
        "command": shlex.join(preset.command),
        "gpus_per_replica": preset.gpus_per_replica,
        "replicas": preset.replicas,
        "cpu_milli": preset.cpu_milli,
        "memory_mib": preset.memory_mib,
        "shm_mib": preset.shm_mib,
        "max_runtime_seconds": preset.max_runtime_seconds,
    }


@tenant_view(Role.MEMBER)
def launch(request: HttpRequest, page: Page) -> HttpResponse:
    """Launch a notebook or a batch job, from a preset (`?preset=<id>` fills the form) or from scratch."""
    choices = LaunchChoices.of(page)
    chosen = choices.preset(request.GET.get("preset"))
    form = forms.LaunchForm(
        request.POST if request.method == "POST" else None,
        initial={**(preset_initial(chosen) if chosen else {}), "idempotency_key": uuid.uuid4().hex},
        project_choices=[(p.slug, p.name) for p in choices.projects],
        pool_choices=[(p.name, p.name) for p in choices.pools],
        gpu_model_choices=choices.gpu_model_choices(),
    )
    if form.is_valid():
        workload = _submit(page, form, choices)
        if workload is not None:
            messages.success(request, f"Workload {workload.name} submitted.")
            return redirect("frontend:workload", tenant=page.tenant.slug, pk=workload.pk)
    elif form.is_bound:
        _add_rule_errors(page, form, choices)
    if form.is_bound:
        chosen = choices.preset(form.data.get(form.add_prefix("preset")))
    context = {"page": page, "form": form, "presets": choices.presets, "preset": chosen, "projects": choices.projects}
    context["budget_notes"] = launch_notes_for_form(form, choices.projects)  # "may use up to N of your remaining M"
    # A refused launch is bad input: the page says which fields and why, with a 400 as the API answers.
    return render(request, "frontend/launch.html", context, status=400 if form.errors else 200)


def _add_rule_errors(page: Page, form: forms.LaunchForm, choices: LaunchChoices) -> None:
    """Put the service's rules that the fields which did clean break next to the form's own errors.

    The form refuses what it cannot parse (a number that is not one) before
    the service runs; the service's rules for the other fields, those that
    read the database included (the allow-list, the quota), are reported with
    them (`submission_errors`, which writes nothing), so the page names every
    failing field at once.
    """
    project = next((p for p in choices.projects if p.slug == form.cleaned_data.get("project")), None)
    pool = choices.pool(form.cleaned_data.get("pool"))
    preset = choices.preset(form.cleaned_data.get("preset"))
    try:
        data = form.workload_data(pool, preset)
        errors = submission_errors(actor=page.actor, project=project, items=[data], refused=[form.refused_fields()])
    except PermissionDenied as error:
        form.add_error(None, str(error))
        return
    if errors:
        form.add_service_errors(ValidationError(errors))


def _submit(page: Page, form: forms.LaunchForm, choices: LaunchChoices) -> Workload | None:
    """Submit the form's workload; on a refusal put the service's errors on the form and return None."""
    project = next(p for p in choices.projects if p.slug == form.cleaned_data["project"])
    pool = choices.pool(form.cleaned_data["pool"])
    preset = choices.preset(form.cleaned_data["preset"])
    try:
        if form.cleaned_data["preset"] and preset is None:
            raise Conflict("That launch preset is gone; choose another or launch without one.")
        return services.submit_workload(
            actor=page.actor,
            project=project,
            data=form.workload_data(pool, preset),
            idempotency_key=form.cleaned_data["idempotency_key"] or None,
        )
    except (ValidationError, Conflict) as error:
        form.add_service_errors(error)
    except PermissionDenied as error:
        form.add_error(None, str(error))
    # The key was not used (nothing was written) or was used for another request: a fresh one either way.
    fresh = form.data.copy() if isinstance(form.data, QueryDict) else dict(form.data)
    fresh[form.add_prefix("idempotency_key")] = uuid.uuid4().hex
    form.data = fresh
    return None
