"""The usage pages: a tenant's report, its CSV and monthly statement, the operators' report and prices.

The ledger is written directly with exact times in March 2026 (a month long
past, so the pages' own clock never moves it): in tenant A, alpha (member_a)
held an H100 for 2 hours on 2 March, and gamma ("@evil", a name a spreadsheet
would read as a formula) one for 3 hours on 3 March; in tenant B, beta held
one for 10 hours. A GPU-hour costs 2.50 all month; CPU and memory are free.
"""

from __future__ import annotations

import csv
import html
import io
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, cast

import pytest
from django.contrib.auth.models import User
from django.http import StreamingHttpResponse
from django.utils import timezone

from accounting.models import Price
from inventory.models import Node
from tenants.models import AuditEvent, Membership, Project
from tests.accounting.factories import hold, minute, workload
from tests.conftest import PASSWORD, World
from tests.frontend.test_pages import logged_in
from tests.jobs.factories import add_node

pytestmark = pytest.mark.django_db

USAGE = "/t/tenant-a/usage/"
EXPORT = "/t/tenant-a/usage/export.csv"
STATEMENT = "/t/tenant-a/usage/statement/"
OPS_USAGE = "/ops/usage/"
OPS_EXPORT = "/ops/usage/export.csv"
PRICES = "/ops/prices/"
MARCH = {"period": "custom", "start": "2026-03-01", "end": "2026-04-01"}
T0 = datetime(2026, 3, 1, tzinfo=UTC)


def _ledger(world: World) -> None:
    """The March ledger of the module's docstring, with a few measured minutes and the GPU price."""
    node = add_node(world, gpus=3)
    gpus = list(node.gpus.order_by("index"))
    evil = User.objects.create_user("@evil", "evil@example.com", PASSWORD)
    Membership.all_tenants.create(tenant=world.tenant_a, user=evil, role="member")
    gamma = Project.all_tenants.create(tenant=world.tenant_a, slug="gamma", name="Gamma")
    train = workload(world, world.project_a, world.member_a, cpu_milli=4000, memory_mib=16384)
    start = T0 + timedelta(days=1)
    hold(train, node, gpus[0], start, start + timedelta(hours=2))
    minute(gpus[0], start + timedelta(minutes=10), 90)
    minute(gpus[0], start + timedelta(minutes=11), 90)
    sweep = workload(world, gamma, evil, name="sweep", cpu_milli=1000, memory_mib=2048)
    later = T0 + timedelta(days=2)
    hold(sweep, node, gpus[1], later, later + timedelta(hours=3))
    minute(gpus[1], later + timedelta(minutes=5), 2)  # idle: below NOTEBOOK_IDLE_UTILIZATION
    other = workload(world, world.project_b, world.admin_b, name="secret-b")
    hold(other, node, gpus[2], start, start + timedelta(hours=10))
    Price.objects.create(resource="gpu", amount_per_hour=Decimal("2.50"), effective_from=T0 - timedelta(days=30))


def _total(page: str, name: str) -> str:
    found = re.search(rf'data-total="{name}"[^>]*><h3>(.*?)</h3>', page, re.S)
    assert found, name
    return " ".join(re.sub(r"<[^>]+>", " ", found[1]).split())


def _field_errors(page: str) -> dict[str, str]:
    found = re.findall(r'<small class="field-error" data-field="(\w+)" role="alert">(.*?)</small>', page, re.S)
    return {field: html.unescape(text) for field, text in found}


def _found(pattern: str, text: str) -> str:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} is not on the page"
    return match[1]


def _chart_data(page: str) -> Any:
    return json.loads(_found(r'<script id="usage-chart-data" type="application/json">(.*?)</script>', page))


def _csv(response: Any) -> list[list[str]]:
    assert isinstance(response, StreamingHttpResponse)
    body = b"".join(cast("Iterator[bytes]", response.streaming_content)).decode()
    return list(csv.reader(io.StringIO(body)))


# --- the tenant's usage page ---------------------------------------------------------------


def test_the_usage_page_shows_the_tenants_totals_and_rows(world: World) -> None:
    _ledger(world)
    response = logged_in("admin_a").get(USAGE, MARCH)
    assert response.status_code == 200
    page = response.content.decode()
    assert _total(page, "gpu_hours") == "5.00", "tenant B's 10 hours are not tenant A's"
    assert _total(page, "cpu_hours") == "11.00"  # 4 cores for 2 hours, 1 for 3
    assert _total(page, "memory_gib_hours") == "38.00"  # 16 GiB for 2 hours, 2 GiB for 3
    assert _total(page, "utilization_percent") == "60.7%"  # (90 + 90 + 2) / 3 measured minutes
    assert _total(page, "idle_gpu_hours") == "0.02"  # gamma's one idle minute
    assert _total(page, "cost") == "12.50 USD"
    assert _total(page, "idle_cost") == "0.04 USD"
    table = page.split('id="usage-rows"')[1]
    assert "<td>alpha</td><td>member_a</td>" in table and "<td>gamma</td><td>@evil</td>" in table
    assert "secret-b" not in page and "beta" not in page
    assert 'href="/t/tenant-a/usage/"' in page and 'aria-current="page">Usage' in page  # the tab


def test_the_charts_draw_gpu_hours_per_day_by_project_and_cost_against_utilization(world: World) -> None:
    _ledger(world)
    page = logged_in("admin_a").get(USAGE, MARCH).content.decode()
    data = _chart_data(page)
    assert data["bucket"] == "day" and len(data["x"]) == 31
    assert data["x"][0] == int(T0.timestamp())
    series = {s["label"]: s["values"] for s in data["series"]}
    assert list(series) == ["gamma", "alpha"], "largest first"
    assert series["alpha"][1] == 2.0 and series["gamma"][2] == 3.0 and sum(series["alpha"]) == 2.0
    assert "gpucloud/usagechart.js" in page and "vendor/uplot/uPlot.iife.min.js" in page
    efficiency = page.split('id="usage-efficiency"')[1]
    gamma = efficiency.split('data-group="gamma"')[1].split("</tr>")[0]
    assert "7.50" in gamma and "0.04" in gamma and "2.0%" in gamma
    assert '<tr class="low" data-group="gamma">' in efficiency, "GPUs 2% busy are flagged"
    assert '<tr data-group="alpha">' in efficiency and "90.0%" in efficiency


def test_the_page_defaults_to_this_month_by_project_and_user(world: World) -> None:
    response = logged_in("admin_a").get(USAGE)
    assert response.status_code == 200
    page = response.content.decode()
    assert '<option value="this-month" selected>' in page
    assert 'name="by" value="project,user"' in page
    assert "No GPU was held in this period." in page and "Nothing was used in this period." in page
    assert 'id="usage-period"' in page and "so far" in page


def test_bad_parameters_show_every_error_by_field_at_once(world: World) -> None:
    response = logged_in("admin_a").get(USAGE, {"period": "custom", "start": "yesterday", "by": "project,tenant"})
    assert response.status_code == 200
    errors = _field_errors(response.content.decode())
    assert set(errors) == {"start", "end", "by"}
    assert "'yesterday'" in errors["start"]
    assert "start and an end" in errors["end"]
    assert "tenant" in errors["by"], "tenant admins may not group by tenant"
    assert 'id="usage-totals"' not in response.content.decode()
    fortnight = logged_in("admin_a").get(USAGE, {"period": "fortnight"}).content.decode()
    assert "fortnight" in _field_errors(fortnight)["period"]
    backwards = logged_in("admin_a").get(USAGE, {"start": "2026-03-05", "end": "2026-03-01"}).content.decode()
    assert set(_field_errors(backwards)) == {"end"}
    assert '<option value="custom" selected>' in backwards, "dates alone make the period custom"


# --- the CSV export ------------------------------------------------------------------------


def test_the_csv_has_the_columns_and_rows_and_escapes_formula_names(world: World) -> None:
    _ledger(world)
    response = logged_in("admin_a").get(EXPORT, MARCH)
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="usage-tenant-a-20260301-20260401.csv"'
    header, *rows = _csv(response)
    assert header == [
        "project",
        "user",
        "gpu_hours",
        "cpu_hours",
        "memory_gib_hours",
        "utilization_percent",
        "sampled_gpu_hours",
        "idle_gpu_hours",
        "cost",
        "idle_cost",
        "currency",
    ]
    assert rows == [
        ["gamma", "'@evil", "3.000000", "3.000000", "6.000000", "2.0", "0.016667", "0.016667", "7.50", "0.04", "USD"],
        [
            "alpha",
            "member_a",
            "2.000000",
            "8.000000",
            "32.000000",
            "90.0",
            "0.033333",
            "0.000000",
            "5.00",
            "0.00",
            "USD",
        ],
    ]


def test_the_csv_follows_the_pages_parameters(world: World) -> None:
    _ledger(world)
    client = logged_in("admin_a")
    page = client.get(USAGE, {**MARCH, "by": "user"}).content.decode()
    link = _found(r'id="usage-export" href="([^"]+)"', page).replace("&amp;", "&")
    header, *rows = _csv(client.get(link))
    assert header[0] == "user" and [row[0] for row in rows] == ["'@evil", "member_a"]
    header, *rows = _csv(client.get(EXPORT, {**MARCH, "by": "project", "bucket": "day"}))
    assert header[:2] == ["period_start", "project"]
    assert [row[:3] for row in rows] == [
        ["2026-03-02T00:00:00+00:00", "alpha", "2.000000"],
        ["2026-03-03T00:00:00+00:00", "gamma", "3.000000"],
    ]


def test_a_csv_with_bad_parameters_is_refused_naming_each(world: World) -> None:
    response = logged_in("admin_a").get(EXPORT, {"period": "custom", "end": "soon", "by": "tenant"})
    assert response.status_code == 400
    text = response.content.decode()
    assert "start:" in text and "end:" in text and "by:" in text


# --- the monthly statement -----------------------------------------------------------------


def test_the_statement_reads_like_an_invoice(world: World) -> None:
    _ledger(world)
    node = Node.objects.get(name="n1")
    etl = workload(world, world.project_a, world.member_a, name="etl", gpus_per_replica=0, cpu_milli=2000)
    hold(etl, node, None, T0 + timedelta(days=4), T0 + timedelta(days=4, hours=5))
    response = logged_in("admin_a").get(STATEMENT, {"month": "2026-03"})
    assert response.status_code == 200
    page = response.content.decode()
    assert "Tenant A" in page and "1 March 2026 \N{EN DASH} 31 March 2026 (UTC)" in page
    lines = page.split('id="statement-lines"')[1]
    rows = [re.sub(r"<[^>]+>", "|", row) for row in re.findall(r"<tr data-project.*?</tr>", lines, re.S)]
    cells = [[cell.strip() for cell in row.split("|") if cell.strip()] for row in rows]
    assert cells == [
        ["alpha", "NVIDIA H100 80GB HBM3", "2.00", "8.00", "32.00", "5.00"],
        ["alpha", "no GPU (CPU only)", "0.00", "10.00", "20.00", "0.00"],
        ["gamma", "NVIDIA H100 80GB HBM3", "3.00", "3.00", "6.00", "7.50"],
    ]
    assert '<th class="num" id="statement-total">USD 12.50</th>' in page
    assert "@media print" in page and ".topbar" in page, "printing leaves the console's menus out"
    assert "secret-b" not in page and "not final" not in page


def test_the_statement_defaults_to_last_month_and_names_a_bad_month(world: World) -> None:
    client = logged_in("admin_a")
    page = client.get(STATEMENT).content.decode()
    first = timezone.now().replace(day=1) - timedelta(days=1)
    assert f'value="{first:%Y-%m}"' in page and "Nothing was used in this month." in page
    bad = client.get(STATEMENT, {"month": "March"}).content.decode()
    assert "YYYY-MM" in _field_errors(bad)["month"] and 'id="statement"' not in bad
    future = client.get(STATEMENT, {"month": f"{timezone.now().year + 1}-01"}).content.decode()
    assert "has not begun" in _field_errors(future)["month"]


# --- who may open the tenant pages ---------------------------------------------------------


@pytest.mark.parametrize("path", [USAGE, EXPORT, STATEMENT])
def test_the_tenant_pages_are_for_its_admins_only(world: World, path: str) -> None:
    _ledger(world)
    assert logged_in("admin_b").get(path, MARCH).status_code == 404, "another tenant's admin finds nothing"
    for username in ("member_a", "viewer_a"):
        assert logged_in(username).get(path, MARCH).status_code == 403, "as the audit log refuses them"
    assert logged_in("admin_a").get(path, MARCH).status_code == 200
    assert logged_in("admin_b").get(path.replace("tenant-a", "tenant-b"), MARCH).status_code == 200


def test_members_see_no_usage_tab(world: World) -> None:
    assert 'href="/t/tenant-a/usage/"' not in logged_in("member_a").get("/t/tenant-a/").content.decode()
    assert 'href="/t/tenant-a/usage/"' in logged_in("admin_a").get("/t/tenant-a/").content.decode()


# --- the operators' pages ------------------------------------------------------------------


@pytest.mark.parametrize("path", [OPS_USAGE, OPS_EXPORT, PRICES])
def test_the_operator_pages_do_not_exist_for_anyone_else(world: World, path: str) -> None:
    for username in ("admin_a", "member_a", "admin_b"):
        assert logged_in(username).get(path).status_code == 404
    assert logged_in("operator").get(path).status_code == 200


def test_the_operators_usage_covers_every_tenant_by_tenant_and_pool(world: World) -> None:
    _ledger(world)
    client = logged_in("operator")
    page = client.get(OPS_USAGE, MARCH).content.decode()
    assert _total(page, "gpu_hours") == "15.00" and _total(page, "cost") == "37.50 USD"
    table = page.split('id="usage-rows"')[1]
    assert "<td>tenant-b</td><td>shared</td>" in table and "<td>tenant-a</td><td>shared</td>" in table
    data = _chart_data(page)
    assert [s["label"] for s in data["series"]] == ["tenant-b", "tenant-a"]
    assert 'href="/ops/usage/"' in page and 'href="/ops/prices/"' in page  # the operator menu
    header, *rows = _csv(client.get(OPS_EXPORT, {**MARCH, "by": "gpu_model"}))
    assert header[0] == "gpu_model" and rows[0][:2] == ["NVIDIA H100 80GB HBM3", "15.000000"]
    assert "tenant" in _field_errors(client.get(OPS_USAGE, {"by": "tenant,rack"}).content.decode())["by"]


# --- prices --------------------------------------------------------------------------------


def _price_form(**overrides: str) -> dict[str, str]:
    return {
        "resource": "gpu",
        "pool": "",
        "gpu_model": "",
        "amount_per_hour": "3.10",
        "effective_from": "",
        **overrides,
    }


def test_an_operator_adds_a_price_from_a_later_date(world: World) -> None:
    client = logged_in("operator")
    later = (timezone.now() + timedelta(days=3)).replace(second=0, microsecond=0)
    response = client.post(PRICES, _price_form(pool="shared", effective_from=f"{later:%Y-%m-%dT%H:%M}"))
    assert response.status_code == 302
    price = Price.objects.get()
    assert (price.pool, price.amount_per_hour, price.effective_from) == (world.pool, Decimal("3.10"), later)
    page = client.get(PRICES).content.decode()
    row = page.split(f'data-price="{price.pk}"')[1].split("</tr>")[0]
    assert "scheduled" in row and "Remove" in row
    assert client.post(PRICES, _price_form(amount_per_hour="1")).status_code == 302, "empty date: from now"
    assert Price.objects.count() == 2


def test_a_price_in_the_past_is_refused_with_every_error_and_nothing_written(world: World) -> None:
    client = logged_in("operator")
    past = _price_form(resource="cpu", gpu_model="H100", amount_per_hour="-1", effective_from="2026-01-01T00:00")
    response = client.post(PRICES, past)
    assert response.status_code == 200
    errors = _field_errors(response.content.decode())
    assert set(errors) == {"effective_from", "gpu_model", "amount_per_hour"}
    assert "never change" in errors["effective_from"]
    assert not Price.objects.exists()
    assert not AuditEvent.all_tenants.filter(action__startswith="price.").exists()


def test_a_price_in_effect_stays_and_a_scheduled_one_can_be_removed(world: World) -> None:
    now = timezone.now()
    old = Price.objects.create(resource="gpu", amount_per_hour=Decimal(1), effective_from=now - timedelta(days=60))
    current = Price.objects.create(resource="gpu", amount_per_hour=Decimal(2), effective_from=now - timedelta(days=1))
    future = Price.objects.create(resource="gpu", amount_per_hour=Decimal(3), effective_from=now + timedelta(days=5))
    client = logged_in("operator")
    page = client.get(PRICES).content.decode()
    states = dict(re.findall(r'data-price="(\d+)" data-state="([a-z ]+)"', page))
    assert states == {str(old.pk): "superseded", str(current.pk): "in effect", str(future.pk): "scheduled"}
    assert page.count(">Remove</button>") == 1, "only a price not yet in effect can be removed"
    refused = client.post(f"/ops/prices/{current.pk}/remove/", follow=True)
    assert Price.objects.filter(pk=current.pk).exists()
    assert "reports of the past never change" in refused.content.decode()
    assert logged_in("admin_a").post(f"/ops/prices/{future.pk}/remove/").status_code == 404
    assert client.post(f"/ops/prices/{future.pk}/remove/").status_code == 302
    assert not Price.objects.filter(pk=future.pk).exists()
    assert AuditEvent.all_tenants.filter(action="price.delete").count() == 1


def test_the_usage_page_is_zero_cost_until_priced_and_charts_gpu_hours_then(world: World) -> None:
    _ledger(world)
    Price.objects.all().delete()
    page = logged_in("admin_a").get(USAGE, MARCH).content.decode()
    assert _total(page, "cost") == "0.00 USD"
    assert "GPU-hours against utilization" in page and "Nothing used here has a price yet" in page
