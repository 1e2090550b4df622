"""Forms of the tenancy pages: login, projects, members and invitations, quotas, tokens, tenants."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from frontend.forms.base import _choices
from tenants.choices import MEMBERSHIP_ROLES, Role
from tenants.context import current_request_info
from tenants.services import login_locked_for


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
