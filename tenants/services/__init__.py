"""All writes and workflows of the tenancy app. Every function is atomic and writes one audit event."""

from tenants.services.access import request_work_sweep
from tenants.services.audit import delete_audited, record_audit_event, snapshot, update_audited
from tenants.services.invitations import (
    IssuedInvitation,
    accept_invitation,
    create_invited_account,
    decline_invitation,
    invite_member,
    name_is_free,
    open_invitation,
    withdraw_invitation,
)
from tenants.services.logins import (
    clear_login_failures,
    login_locked_for,
    purge_expired_sessions,
)
from tenants.services.members import (
    projects_named,
    remove_member,
    update_member,
)
from tenants.services.quotas import (
    QuotaValues,
    create_project_quota,
    create_tenant_quota,
    delete_project_quota,
    delete_tenant_quota,
    quota_errors,
    update_project_quota,
    update_tenant_quota,
)
from tenants.services.tenants import (
    create_project,
    create_tenant,
    delete_project,
    delete_tenant,
    update_project,
    update_tenant,
)
from tenants.services.tokens import IssuedToken, create_token, default_token_role, revoke_token
from tenants.services.users import create_operator

__all__ = [
    "IssuedInvitation",
    "IssuedToken",
    "QuotaValues",
    "accept_invitation",
    "clear_login_failures",
    "create_invited_account",
    "create_operator",
    "create_project",
    "create_project_quota",
    "create_tenant",
    "create_tenant_quota",
    "create_token",
    "decline_invitation",
    "default_token_role",
    "delete_audited",
    "delete_project",
    "delete_project_quota",
    "delete_tenant",
    "delete_tenant_quota",
    "invite_member",
    "login_locked_for",
    "name_is_free",
    "open_invitation",
    "projects_named",
    "purge_expired_sessions",
    "quota_errors",
    "record_audit_event",
    "remove_member",
    "request_work_sweep",
    "revoke_token",
    "snapshot",
    "update_audited",
    "update_member",
    "update_project",
    "update_project_quota",
    "update_tenant",
    "update_tenant_quota",
    "withdraw_invitation",
]
