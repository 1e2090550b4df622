"""Image references may not make a node's engine pull from its own loopback or a cloud's metadata service."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from jobs.models import Workload
from jobs.services.registries import host_of, is_blocked_host, registry_of
from tests.conftest import World, client_for
from tests.jobs.factories import ready_world

URL = "/api/v1/tenants/tenant-a/workloads/"

BLOCKED = [
    "127.0.0.1:5000/team/train:1",
    "127.0.0.1/x",
    "127.9.9.9:2375/x:1",
    "127.1:5000/x",  # the resolver reads it as 127.0.0.1
    "0x7f.0.0.1:5000/x",
    "0.0.0.0:5000/x",
    "169.254.169.254/latest:1",
    "169.254.1.1:80/x",
    "localhost/x:1",
    "localhost:5000/x:1",
    "registry.localhost:5000/x",
    "metadata.google.internal/computemetadata:v1",
    "metadata.google.internal./x",
    "100.100.100.200/x",
]
ALLOWED = ["busybox:1.36", "team/train:1", "registry.example.com:5000/team/train:1", "10.0.0.5:5000/x", "ghcr.io/a/b"]


def _body(**overrides: Any) -> dict[str, Any]:
    return {"project": "alpha", "pool": "shared", "name": "train", "image": "busybox:1.36", **overrides}


@pytest.mark.parametrize("image", BLOCKED)
def test_a_loopback_link_local_or_metadata_registry_is_blocked(image: str) -> None:
    registry = registry_of(image)
    assert registry is not None and is_blocked_host(host_of(registry))


@pytest.mark.parametrize("image", ALLOWED)
def test_other_registries_and_docker_hub_are_not(image: str) -> None:
    registry = registry_of(image)
    assert registry is None or not is_blocked_host(host_of(registry))


@pytest.mark.parametrize("v6", ["::1", "fe80::1", "::", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "fd00:ec2::254"])
def test_ipv6_spellings_are_blocked_too(v6: str) -> None:
    assert is_blocked_host(host_of(f"[{v6}]:5000"))


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["", "validate/", "bulk/"])
def test_the_api_refuses_such_an_image_on_the_image_field_and_writes_nothing(world: World, path: str) -> None:
    ready_world(world)
    bad = _body(name="Bad Name", image="169.254.169.254/latest:1")
    body = {"project": "alpha", "items": [{k: v for k, v in bad.items() if k != "project"}]} if path == "bulk/" else bad
    response = client_for(world.member_a).post(f"{URL}{path}", body, format="json")
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    prefix = "items[0]." if path == "bulk/" else ""
    assert fields[f"{prefix}image"][0]["code"] == "blocked_registry"
    assert fields[f"{prefix}name"][0]["code"] == "invalid_name"  # with every other rule, at once
    assert not Workload.all_tenants.exists()


@pytest.mark.django_db
def test_an_operator_may_allow_a_registry_by_host_or_host_and_port(world: World) -> None:
    ready_world(world)
    member = client_for(world.member_a)
    image = "127.0.0.1:5000/team/train:1"
    assert member.post(f"{URL}validate/", _body(image=image), format="json").status_code == 400
    for allowed in (["127.0.0.1:5000"], ["127.0.0.1"]):
        with override_settings(IMAGE_REGISTRIES_ALLOWED=allowed):
            assert member.post(f"{URL}validate/", _body(image=image), format="json").status_code == 200
    with override_settings(IMAGE_REGISTRIES_ALLOWED=["127.0.0.1:5001"]):
        assert member.post(f"{URL}validate/", _body(image=image), format="json").status_code == 400
    with override_settings(IMAGE_REGISTRIES_ALLOWED=["127.0.0.1:5000"]):
        assert member.post(URL, _body(image=image), format="json").status_code == 201
