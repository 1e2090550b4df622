"""Operators' allowed-images page and tenant admins' launch-presets page."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.models import AllowedImage, LaunchPreset
from jobs.services import images
from tenants.context import Actor
from tenants.models import AuditEvent
from tests.conftest import World
from tests.frontend.test_pages import logged_in

pytestmark = pytest.mark.django_db

OPS = "/ops/images/"
PRESETS = "/t/tenant-a/presets/"


def _preset_form(prefix: str = "new-", **overrides: Any) -> dict[str, Any]:
    data = {
        "name": "PyTorch notebook",
        "kind": "notebook",
        "image": "registry.local/jupyter:4",
        "pool": "shared",
        "gpus_per_replica": "1",
        "replicas": "1",
        "cpu_milli": "2000",
        "memory_mib": "8192",
        "idle_timeout_seconds": "1800",
        **overrides,
    }
    return {f"{prefix}{key}": value for key, value in data.items()}


# --- allowed images (operators) ------------------------------------------------------------


def test_the_images_page_is_for_operators_only(world: World) -> None:
    for user in ("admin_a", "member_a"):
        assert logged_in(user).get(OPS).status_code == 404
    page = logged_in("operator").get(OPS)
    assert page.status_code == 200
    assert b"Every image is allowed" in page.content
    assert b'href="/ops/images/"' in page.content  # in the operator menu


def test_an_operator_allows_a_pattern_for_a_tenant_and_for_every_tenant(world: World) -> None:
    client = logged_in("operator")
    response = client.post(OPS, {"pattern": "registry.local/*", "tenant": "tenant-a", "notebook": "on"})
    assert response.status_code == 302
    client.post(OPS, {"pattern": "busybox:*", "tenant": ""})
    rows = {(i.tenant_id, i.pattern, i.notebook) for i in AllowedImage.objects.all()}
    assert rows == {(world.tenant_a.pk, "registry.local/*", True), (None, "busybox:*", False)}
    page = client.get(OPS).content.decode()
    assert "The allow-list applies" in page
    assert "— every tenant —" in page and "Tenant A" in page
    assert AuditEvent.all_tenants.filter(action="allowed_image.create").count() == 2


def test_a_bad_pattern_is_shown_on_its_field_and_nothing_is_written(world: World) -> None:
    response = logged_in("operator").post(OPS, {"pattern": "Not An Image", "tenant": ""})
    assert response.status_code == 200
    assert 'data-field="pattern"' in response.content.decode()
    assert not AllowedImage.objects.exists()


def test_an_operator_removes_a_pattern(world: World) -> None:
    image = images.create_allowed_image(actor=Actor(user=world.operator), pattern="busybox:*")
    url = f"/ops/images/{image.pk}/delete/"
    assert logged_in("admin_a").post(url).status_code == 404
    assert logged_in("operator").get(url).status_code == 405
    assert logged_in("operator").post(url).status_code == 302
    assert not AllowedImage.objects.exists()


# --- launch presets (tenant admins) ----------------------------------------------------------


def test_the_presets_page_is_for_tenant_admins(world: World) -> None:
    assert logged_in("member_a").get(PRESETS).status_code == 403
    assert logged_in("admin_b").get(PRESETS).status_code == 404
    page = logged_in("admin_a").get(PRESETS).content.decode()
    assert f'href="{PRESETS}"' in page  # in the tenant's tabs
    assert "every image is allowed" in page
    assert f'href="{PRESETS}"' not in logged_in("member_a").get("/t/tenant-a/").content.decode()


def test_an_admin_creates_edits_and_deletes_a_preset(world: World) -> None:
    client = logged_in("admin_a")
    assert client.post(PRESETS, _preset_form()).status_code == 302
    preset = LaunchPreset.all_tenants.get()
    assert (preset.kind, preset.pool, preset.idle_timeout_seconds, preset.command) == (
        "notebook",
        world.pool,
        1800,
        [],
    )
    assert "PyTorch notebook" in client.get(PRESETS).content.decode()
    url = f"{PRESETS}{preset.pk}/"
    edited = _preset_form("", kind="job", idle_timeout_seconds="", command="python train.py --epochs 3")
    assert client.post(url, edited).status_code == 302
    preset.refresh_from_db()
    assert (preset.kind, preset.command, preset.idle_timeout_seconds) == (
        "job",
        ["python", "train.py", "--epochs", "3"],
        None,
    )
    assert client.post(url, {"delete": "1"}).status_code == 302
    assert not LaunchPreset.all_tenants.exists()


def test_a_refused_preset_shows_the_rule_on_its_field(world: World) -> None:
    images.create_allowed_image(actor=Actor(user=world.operator), pattern="registry.local/train:*")
    response = logged_in("admin_a").post(PRESETS, _preset_form(image="registry.local/train:1"))
    assert response.status_code == 200
    page = response.content.decode()
    assert 'data-field="image"' in page and "allowed for batch jobs only" in page
    assert "registry.local/train:*" in page  # the images the tenant may run are listed
    assert not LaunchPreset.all_tenants.exists()


def test_another_tenants_preset_is_not_found(world: World) -> None:
    theirs = LaunchPreset.all_tenants.create(tenant=world.tenant_b, name="x", image="busybox:1", pool=world.pool)
    assert logged_in("admin_a").get(f"{PRESETS}{theirs.pk}/").status_code == 404
    assert logged_in("admin_a").post(f"{PRESETS}{theirs.pk}/", {"delete": "1"}).status_code == 404
    assert LaunchPreset.all_tenants.filter(pk=theirs.pk).exists()
