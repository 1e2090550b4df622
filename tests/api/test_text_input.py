"""Text the database or JSON cannot carry (lone surrogates, NUL) is refused on input, and never breaks output.

A lone surrogate in a workload's `command` used to answer 500 yet create the
workload; from then on the tenant's workload list and that workload's page
answered 500 for everyone. Input is now refused where the API parses JSON
(common/api/parsers.py, common/text.py), naming every field at once; a row
stored before that renders U+FFFD (common/api/renderers.py, common/templating.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import DataError, connection, transaction
from django.test import Client

from jobs.models import Workload
from tests.conftest import World, client_for
from tests.frontend.test_pages import logged_in
from tests.frontend.test_workload_pages import LAUNCH, _field_error, _launch_form
from tests.jobs.factories import assign, ready_world

pytestmark = pytest.mark.django_db

URL = "/api/v1/tenants/tenant-a/workloads/"
LONE = "\udc80"


def _post(world: World, url: str, body: Any) -> Any:
    # json.dumps spells the lone surrogate and NUL as \\u escapes, exactly as a client's JSON would.
    return client_for(world.member_a).post(url, data=json.dumps(body), content_type="application/json")


def _body(**overrides: Any) -> dict[str, Any]:
    return {"project": "alpha", "pool": "shared", "name": "train", "image": "busybox:1.36", **overrides}


def test_every_field_with_unstorable_text_is_named_and_nothing_is_written(world: World) -> None:
    ready_world(world)
    body = _body(name=f"train{LONE}", command=["python", f"run{LONE}.py"], env={"HOME": "/x\x00", "OK": "fine"})
    response = _post(world, URL, body)
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    assert set(fields) == {"name", "command[1]", "env.HOME"}
    assert {error["code"] for errors in fields.values() for error in errors} == {"invalid_text"}
    assert not Workload.all_tenants.exists()


def test_a_bulk_submission_names_the_item_and_field(world: World) -> None:
    ready_world(world)
    items = [_body(name="ok"), _body(name="bad", command=[LONE])]
    items = [{k: v for k, v in item.items() if k != "project"} for item in items]
    response = _post(world, f"{URL}bulk/", {"project": "alpha", "items": items})
    assert response.status_code == 400, response.content
    assert set(response.json()["error"]["fields"]) == {"items[1].command[0]"}
    assert not Workload.all_tenants.exists()


def test_valid_text_beyond_the_basic_plane_is_kept(world: World) -> None:
    ready_world(world)
    response = _post(world, URL, _body(command=["echo", "\U0001f600 caf\u00e9"]))
    assert response.status_code == 201, response.content
    assert response.json()["command"] == ["echo", "\U0001f600 caf\u00e9"]


def test_a_row_stored_with_bad_text_still_renders_in_the_list_the_detail_and_the_page(world: World) -> None:
    ready_world(world)
    created = _post(world, URL, _body()).json()
    stored = Workload.all_tenants.filter(pk=created["id"])
    if connection.vendor == "postgresql":
        # Postgres cannot hold such a row at all: the write itself is refused, so no list can meet one.
        with pytest.raises((DataError, UnicodeEncodeError)), transaction.atomic():
            stored.update(command=["echo", f"a{LONE}b"])
        return
    stored.update(command=["echo", f"a{LONE}b"])
    client = client_for(world.viewer_a)
    listed = client.get(URL)
    assert listed.status_code == 200
    assert listed.json()["results"][0]["command"] == ["echo", "a\ufffdb"]
    assert client.get(f"{URL}{created['id']}/").json()["command"] == ["echo", "a\ufffdb"]
    browser = Client()
    browser.force_login(world.viewer_a)
    page = browser.get(f"/t/tenant-a/workloads/{created['id']}/")
    assert page.status_code == 200 and "a\ufffdb" in page.content.decode()


def test_the_launch_form_refuses_nul_in_every_field_at_once(world: World) -> None:
    # Browsers' form bodies cannot carry a lone surrogate (Django decodes them with replacement); NUL they can.
    ready_world(world)
    assign(world.member_a, world.project_a)
    form = _launch_form(world, name="train\x00", command="echo \x00", env="HOME=/x\x00")
    response = logged_in("member_a").post(LAUNCH, form)
    page = response.content.decode()
    assert response.status_code == 400
    for field in ("name", "command", "env"):
        assert "Null characters are not allowed." in _field_error(page, field), field
    assert not Workload.all_tenants.exists()
