"""The accounting API: reports by any grouping and as CSV, every bad parameter named at once, prices with history."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from accounting.models import Price
from inventory.models import NodePool
from tests.accounting.factories import hold, workload
from tests.conftest import World, client_for
from tests.frontend.test_pages import logged_in
from tests.jobs.factories import H100, add_node

pytestmark = pytest.mark.django_db


def _codes(response: Any) -> dict[str, list[str]]:
    return {name: [e["code"] for e in errors] for name, errors in response.json()["error"]["fields"].items()}


def _yesterday_and_today(world: World) -> None:
    """member_a held one H100 for 2 h yesterday (UTC); tenant B held one for 5 h."""
    node = add_node(world, gpus=2)
    gpu_a, gpu_b = node.gpus.order_by("index")
    day = datetime.combine(timezone.now().date() - timedelta(days=1), datetime.min.time(), tzinfo=UTC)
    hold(workload(world, world.project_a, world.member_a), node, gpu_a, day, day + timedelta(hours=2))
    hold(workload(world, world.project_b, world.admin_b), node, gpu_b, day, day + timedelta(hours=5))


def test_a_tenant_admin_reads_the_tenant_by_project_and_user(world: World) -> None:
    _yesterday_and_today(world)
    start = (timezone.now() - timedelta(days=2)).date().isoformat()
    response = client_for(world.admin_a).get(
        f"/api/v1/tenants/tenant-a/accounting/?start={start}&end={timezone.now().date() + timedelta(days=1)}"
        "&by=project,user"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["group_by"] == ["project", "user"]
    assert [(row["key"], row["gpu_hours"]) for row in body["rows"]] == [({"project": "alpha", "user": "member_a"}, 2.0)]
    assert body["total"]["gpu_hours"] == 2.0 and body["currency"] == "USD"


def test_daily_rows_split_the_report_by_utc_day(world: World) -> None:
    _yesterday_and_today(world)
    response = client_for(world.operator).get(
        "/api/v1/accounting/?by=tenant&bucket=day&start=2020-01-01&end=2020-01-03"
    )
    assert response.status_code == 200
    assert response.json()["rows"] == []  # nothing then, and no bucket invents a row
    today = timezone.now().date()
    response = client_for(world.operator).get(
        f"/api/v1/accounting/?by=tenant&bucket=day&start={today - timedelta(days=1)}&end={today + timedelta(days=1)}"
    )
    rows = response.json()["rows"]
    assert [(row["period_start"][:10], row["key"]["tenant"], row["gpu_hours"]) for row in rows] == [
        (str(today - timedelta(days=1)), "tenant-b", 5.0),
        (str(today - timedelta(days=1)), "tenant-a", 2.0),
    ]


def test_every_bad_parameter_is_named_at_once(world: World) -> None:
    response = client_for(world.admin_a).get(
        "/api/v1/tenants/tenant-a/accounting/?start=soon&by=tenant,user&bucket=week"
    )
    assert response.status_code == 400
    assert _codes(response) == {
        "start": ["invalid_time"],
        "end": ["required"],
        "by": ["invalid_choice"],  # a tenant admin sees one tenant: grouping by tenant is an operator's
        "bucket": ["invalid_choice"],
    }


def test_a_blank_period_or_bucket_is_refused_by_the_api_as_the_schema_says(world: World) -> None:
    """The schema lists their choices; a blank one is not among them (leave it out for the default). The usage
    page's form sends blanks for its "none" choices and gets the defaults (tests/frontend/test_usage_pages.py)."""
    admin = client_for(world.admin_a)
    refused = admin.get("/api/v1/tenants/tenant-a/accounting/?period=&bucket=&by=")
    assert refused.status_code == 400
    assert _codes(refused) == {"period": ["blank"], "bucket": ["blank"]}
    assert admin.get("/api/v1/tenants/tenant-a/accounting/?by=").status_code == 200  # no grouping: totals only
    page = logged_in("admin_a").get("/t/tenant-a/usage/?period=&bucket=")
    assert page.status_code == 200 and 'id="usage-totals"' in page.content.decode(), "the defaults, no error"


def test_the_csv_export_is_the_report_row_by_row(world: World) -> None:
    _yesterday_and_today(world)
    Price.objects.create(
        resource="gpu", amount_per_hour=Decimal("2.5"), effective_from=datetime(2020, 1, 1, tzinfo=UTC)
    )
    response = client_for(world.admin_a).get("/api/v1/tenants/tenant-a/accounting/csv/?by=user&period=this-month")
    if timezone.now().day == 1:  # yesterday was last month
        response = client_for(world.admin_a).get("/api/v1/tenants/tenant-a/accounting/csv/?by=user&period=last-month")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith('attachment; filename="usage-tenant-a-')
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))  # type: ignore[attr-defined]  # the test client types every answer as plain
    assert [(row["user"], row["gpu_hours"], row["cost"], row["currency"]) for row in rows] == [
        ("member_a", "2.000000", "5.00", "USD")
    ]


def test_a_price_in_the_past_or_of_an_unknown_pool_is_refused_whole(world: World) -> None:
    response = client_for(world.operator).post(
        "/api/v1/prices/",
        {
            "resource": "cpu",
            "gpu_model": "A100",
            "pool": "nowhere",
            "amount_per_hour": "1",
            "effective_from": "2020-01-01T00:00:00Z",
        },
        format="json",
    )
    assert response.status_code == 400
    assert _codes(response) == {"gpu_model": ["gpu_only"], "pool": ["not_found"], "effective_from": ["in_the_past"]}
    assert not Price.objects.exists()


def test_a_price_applies_from_its_date_and_only_a_future_one_can_be_removed(world: World) -> None:
    node = add_node(world, gpus=1, model=H100)
    start = timezone.now() - timedelta(hours=3)
    hold(workload(world, world.project_a, world.member_a), node, node.gpus.get(), start, start + timedelta(hours=2))
    operator = client_for(world.operator)
    now_price = operator.post("/api/v1/prices/", {"resource": "gpu", "amount_per_hour": "2"}, format="json")
    assert now_price.status_code == 201, now_price.content
    later = operator.post(
        "/api/v1/prices/",
        {
            "resource": "gpu",
            "gpu_model": H100,
            "amount_per_hour": "9",
            "effective_from": (timezone.now() + timedelta(days=1)).isoformat(),
        },
        format="json",
    )
    assert later.status_code == 201 and later.json()["in_effect"] is False
    query = f"?start={(start - timedelta(hours=1)).isoformat()}&end={timezone.now().isoformat()}".replace("+", "%2B")
    # The work ran before either price: it cost nothing, and a price added now does not reprice it.
    assert (
        client_for(world.admin_a).get(f"/api/v1/tenants/tenant-a/accounting/{query}").json()["total"]["cost"] == "0.00"
    )
    refused = operator.delete(f"/api/v1/prices/{now_price.json()['id']}/")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "price_in_effect"
    assert operator.delete(f"/api/v1/prices/{later.json()['id']}/").status_code == 204
    assert list(Price.objects.values_list("amount_per_hour", flat=True)) == [Decimal("2")]


def test_prices_of_a_pool_dedicated_to_another_tenant_are_hidden(world: World) -> None:
    private = NodePool.objects.create(name="b-only", dedicated_tenant=world.tenant_b)
    now = timezone.now()
    shared = Price.objects.create(resource="gpu", amount_per_hour=Decimal("2"), effective_from=now)
    secret = Price.objects.create(resource="gpu", pool=private, amount_per_hour=Decimal("7"), effective_from=now)

    def seen(user: Any) -> set[int]:
        return {row["id"] for row in client_for(user).get("/api/v1/prices/").json()["results"]}

    assert seen(world.admin_a) == {shared.pk}
    assert client_for(world.admin_a).get(f"/api/v1/prices/{secret.pk}/").status_code == 404
    assert seen(world.admin_b) == {shared.pk, secret.pk}
    assert seen(world.operator) == {shared.pk, secret.pk}
