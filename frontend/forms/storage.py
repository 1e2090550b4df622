"""Forms of the storage pages: volumes, shares, quotas of storage, uploads and folders."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms

from inventory.choices import VolumeKind

GIB = 1024**3


class _ProjectChoiceForm(forms.Form):
    """A form with a `project` choice among the tenant's projects, given when it is made (`blank_project`: "—" too)."""

    blank_project = False

    def __init__(self, *args: Any, project_choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["project"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [("", "—"), *project_choices] if self.blank_project else project_choices


def _gib(**kwargs: Any) -> forms.DecimalField:
    # No upper bound here: ranges are the services', reported in their words.
    return forms.DecimalField(
        required=False, min_value=0, decimal_places=3, help_text="GiB; empty: no limit.", **kwargs
    )


def gib_to_bytes(gib: Decimal | None) -> int | None:
    """Return a size entered in GiB as bytes (None: no limit)."""
    return None if gib is None else int(gib * GIB)


class VolumeForm(_ProjectChoiceForm):
    kind = forms.ChoiceField(choices=[(VolumeKind.PROJECT, "Project volume"), (VolumeKind.DATASET, "Dataset")])
    name = forms.CharField(max_length=40, help_text="Mounted at /projects/<name> or /datasets/<name>.")
    project = forms.ChoiceField(required=False, help_text="A dataset without one is the tenant's.")
    description = forms.CharField(max_length=200, required=False)
    size_limit_bytes = _gib(label="Size limit")

    blank_project = True


class TenantStorageForm(forms.Form):
    storage_limit_bytes = _gib(label="Tenant storage quota")
    home_limit_bytes = _gib(label="Home limit (each member)")


class ProjectStorageForm(_ProjectChoiceForm):
    project = forms.ChoiceField()
    storage_limit_bytes = _gib(label="Project storage quota")


class VolumeEditForm(forms.Form):
    description = forms.CharField(max_length=200, required=False)
    size_limit_bytes = _gib(label="Size limit")


class ShareForm(_ProjectChoiceForm):
    project = forms.ChoiceField()
    read_only = forms.BooleanField(required=False, initial=True, label="Read-only")


class UploadForm(forms.Form):
    file = forms.FileField()


class FolderForm(forms.Form):
    path = forms.CharField(max_length=4096, strip=False, label="New folder", help_text="Inside this folder.")
