"""Operators' page of allowed images: the patterns by tenant, add one, remove one.

The rules (pattern syntax, uniqueness, who may) are `jobs.services.images`';
their errors land on the form's fields.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from frontend.access import actor_of, operator_view
from frontend.views import again, attempt
from jobs import selectors
from jobs.models import AllowedImage
from jobs.services import images
from tenants.models import Tenant

EVERY_TENANT = ""


class AllowedImageForm(forms.Form):
    """A pattern to allow; the rules are the service's."""

    pattern = forms.CharField(
        max_length=255,
        strip=False,
        widget=forms.TextInput(attrs={"placeholder": "registry.local/pytorch:*"}),
        help_text="An image reference; * matches any characters (/ and : included), ? one character.",
    )
    tenant = forms.ChoiceField(required=False, label="For tenant")
    notebook = forms.BooleanField(required=False, label="Can serve a Jupyter notebook")
    description = forms.CharField(max_length=200, required=False)

    def __init__(self, *args: Any, tenant_choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["tenant"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [(EVERY_TENANT, "— every tenant —"), *tenant_choices]


def _create(request: HttpRequest, form: AllowedImageForm) -> AllowedImage:
    data = dict(form.cleaned_data)
    slug = data.pop("tenant")
    tenant = get_object_or_404(Tenant, slug=slug) if slug != EVERY_TENANT else None
    return images.create_allowed_image(actor=actor_of(request), tenant=tenant, **data)


@operator_view
def ops_images(request: HttpRequest) -> HttpResponse:
    tenants = [(t.slug, t.name) for t in Tenant.objects.order_by("slug")]
    form = AllowedImageForm(request.POST if request.method == "POST" else None, tenant_choices=tenants)
    if form.is_valid() and attempt(form, lambda: _create(request, form)):
        messages.success(request, f"{form.cleaned_data['pattern']} allowed.")
        return again(request)
    patterns = list(selectors.allowed_images_for_operators())
    return render(request, "frontend/ops_images.html", {"patterns": patterns, "form": form})


@require_POST
@operator_view
def ops_image_delete(request: HttpRequest, pk: int) -> HttpResponse:
    image = get_object_or_404(AllowedImage, pk=pk)
    images.delete_allowed_image(actor=actor_of(request), image=image)
    messages.success(request, f"{image.pattern} is no longer allowed.")
    return redirect("frontend:ops_images")
