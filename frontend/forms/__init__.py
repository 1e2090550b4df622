"""Forms of the web UI: input shapes only. The rules are the services', whose errors land on these fields.

One module per area; every form is importable from here.
"""

from frontend.forms.base import apply_service_errors
from frontend.forms.inventory import (
    GpuFilterForm,
    NodeFilterForm,
    NodeForm,
    PoolFilterForm,
    PoolForm,
    ReasonForm,
    RetireForm,
)
from frontend.forms.jobs import LaunchForm, WorkloadFilterForm
from frontend.forms.storage import (
    GIB,
    FolderForm,
    ProjectStorageForm,
    ShareForm,
    TenantStorageForm,
    UploadForm,
    VolumeEditForm,
    VolumeForm,
    gib_to_bytes,
)
from frontend.forms.tenancy import (
    InviteForm,
    LoginForm,
    MemberForm,
    ProjectEditForm,
    ProjectForm,
    ProjectQuotaForm,
    QuotaNumbersForm,
    TenantForm,
    TenantQuotaForm,
    TokenForm,
)

__all__ = [
    "GIB",
    "FolderForm",
    "GpuFilterForm",
    "InviteForm",
    "LaunchForm",
    "LoginForm",
    "MemberForm",
    "NodeFilterForm",
    "NodeForm",
    "PoolFilterForm",
    "PoolForm",
    "ProjectEditForm",
    "ProjectForm",
    "ProjectQuotaForm",
    "ProjectStorageForm",
    "QuotaNumbersForm",
    "ReasonForm",
    "RetireForm",
    "ShareForm",
    "TenantForm",
    "TenantQuotaForm",
    "TenantStorageForm",
    "TokenForm",
    "UploadForm",
    "VolumeEditForm",
    "VolumeForm",
    "WorkloadFilterForm",
    "apply_service_errors",
    "gib_to_bytes",
]
