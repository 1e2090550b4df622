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
    """An invitation: who, with which role, onto which of the tenant's projects.

    The fields take any text: the service checks them all together and
    reports every broken rule at once, each on its field.
    """

    username = forms.CharField(max_length=150, help_text="Letters, digits and @ . + - _; they log in with it.")
    email = forms.CharField(max_length=254, required=False, widget=forms.EmailInput, label="Email (optional)")
    role = forms.ChoiceField(choices=MEMBERSHIP_ROLES, initial=Role.MEMBER)
    projects = forms.MultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple, help_text="The projects they can launch work in."
    )

    def __init__(self, *args: Any, project_choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "projects", project_choices)


class MemberForm(forms.Form):
    role = forms.ChoiceField(choices=MEMBERSHIP_ROLES)
    projects = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple)

    def __init__(self, *args: Any, project_choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "projects", project_choices)


class QuotaNumbersForm(forms.Form):
    """A quota's numbers; an empty limit (GPUs or counts) means no limit at this level."""

    guaranteed = forms.IntegerField(initial=0, label="Guaranteed GPUs")
    limit = forms.IntegerField(required=False, label="Limit (GPUs)", help_text="Empty: no limit.")
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


# What a token of each role may do, as the token form says it (docs/api.md says the same).
TOKEN_ROLE_ALLOWS = {
    Role.VIEWER.value: "read everything in the tenant; change nothing",
    Role.MEMBER.value: "also launch workloads in your projects and stop or restart your own",
    Role.ADMIN.value: "also manage members, projects, quotas, presets and anyone's workloads",
}


class AuditFilterForm(forms.Form):
    """The audit log's filters; every one may be left empty. Days are UTC, both ends included."""

    actor = forms.ChoiceField(required=False, label="Who")
    subject = forms.CharField(max_length=100, required=False, help_text="Part of a name: a user, project, pool…")
    action = forms.CharField(max_length=64, required=False, help_text="e.g. membership. or project_quota.update")
    since = forms.DateField(required=False, label="From (day)", widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, label="To (day)", widget=forms.DateInput(attrs={"type": "date"}))

    def __init__(self, *args: Any, actor_choices: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "actor", [("", "anyone"), *((name, name) for name in actor_choices)])

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        since, until = data.get("since"), data.get("until")
        if since and until and until < since:
            self.add_error("until", "The last day must not be before the first.")
        return data


class TokenForm(forms.Form):
    """A new API token; its role starts at the owner's own (the view sets it) and lists what each role allows."""

    name = forms.CharField(max_length=80)
    role = forms.ChoiceField(help_text="Starts at your own role: a token never has more rights than you.")
    expires_in_days = forms.IntegerField(
        initial=90, min_value=1, max_value=settings.API_TOKEN_MAX_DAYS, label="Expires in (days)"
    )

    def __init__(self, *args: Any, role_choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choices(self, "role", [(value, _described(value, label)) for value, label in role_choices])


def _described(role: str, label: str) -> str:
    allows = TOKEN_ROLE_ALLOWS.get(role)
    return f"{label}: {allows}" if allows else label


class TenantForm(ProjectForm):
    """A new tenant has the same parts as a new project: a permanent slug, a name, a description."""
