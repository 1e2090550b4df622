"""Workers racing on one delivery: the compare-and-swap claim lets exactly one of them send it.

Runs on SQLite and, with DATABASE_URL pointing at Postgres, on Postgres (where workers really race).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection

from notifications import services
from notifications.choices import Channel, DeliveryState
from notifications.models import Delivery
from tenants.context import Actor
from tests.conftest import World
from tests.notifications.servers import http_receiver

WORKERS = 8


@pytest.mark.django_db(transaction=True)
def test_eight_workers_send_one_delivery_once(world: World) -> None:
    with http_receiver([200]) as receiver:
        services.create_webhook(
            actor=Actor(user=world.admin_a), tenant=world.tenant_a, url=receiver.url, kinds=["workload.failed"]
        )
        services.notify_workload_ended(
            tenant_id=world.tenant_a.pk, owner_id=world.member_a.pk, workload_id=1, name="x", workload_kind="job",
            failed=True, reason_code="exit_nonzero", message="Exited with code 1.",
        )  # fmt: skip
        delivery = Delivery.all_tenants.get(channel=Channel.WEBHOOK)
        start = threading.Barrier(WORKERS)
        outcomes: list[Any] = []

        def worker() -> None:
            start.wait()
            try:
                outcomes.append(services.send_delivery(delivery_id=delivery.pk))
            finally:
                connection.close()

        threads = [threading.Thread(target=worker) for _ in range(WORKERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)

    assert len(outcomes) == WORKERS
    assert outcomes.count(DeliveryState.SUCCEEDED) == 1 and outcomes.count(None) == WORKERS - 1
    assert len(receiver.requests) == 1
    assert Delivery.all_tenants.get(pk=delivery.pk).attempts == 1
