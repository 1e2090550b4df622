"""Sending for real: e-mail to an SMTP server on 127.0.0.1, signed webhooks to HTTP receivers that verify them,
fail a few times, or always fail; retries with back-off, final states, and sending each attempt once."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from notifications import services, signing, tasks
from notifications.choices import Channel, DeliveryState, EventKind
from notifications.models import Delivery, Notification
from notifications.services import IssuedWebhook
from tenants.context import Actor
from tests.conftest import World
from tests.notifications.servers import Mailbox, free_port, http_receiver

pytestmark = pytest.mark.django_db


def _hook(world: World, url: str, kinds: tuple[str, ...] = ("workload.failed",)) -> IssuedWebhook:
    return services.create_webhook(actor=Actor(user=world.admin_a), tenant=world.tenant_a, url=url, kinds=list(kinds))


def _failed(world: World, *, name: str = "train") -> Notification:
    found = services.notify_workload_ended(
        tenant_id=world.tenant_a.pk, owner_id=world.member_a.pk, workload_id=41, name=name, workload_kind="job",
        failed=True, reason_code="exit_nonzero", message="Replica 0 exited with code 3.",
    )  # fmt: skip
    assert found is not None
    return found


def _delivery(notification: Notification, channel: str = Channel.WEBHOOK) -> Delivery:
    return Delivery.all_tenants.get(notification=notification, channel=channel)


def _receiver_check(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """What a receiver does, written out without the console's code: HMAC-SHA256 of "<timestamp>.<body>"."""
    timestamp = headers["x-gpucloud-timestamp"]
    expected = "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    fresh = abs(time.time() - int(timestamp)) < 300
    return fresh and hmac.compare_digest(expected, headers["x-gpucloud-signature"])


def test_an_email_reaches_a_real_smtp_server(world: World, mailbox: Mailbox) -> None:
    notification = services.notify_idle_warning(
        tenant=world.tenant_a, owner_id=world.member_a.pk, workload_id=7, name="explore",
        stop_at=timezone.now() + timedelta(minutes=10), message="Idle for 50 minutes: it will be hibernated.",
    )  # fmt: skip
    assert notification is not None
    delivery = _delivery(notification, Channel.EMAIL)
    assert delivery.address == "member_a@example.com" and delivery.state == DeliveryState.PENDING

    assert services.send_delivery(delivery_id=delivery.pk) == DeliveryState.SUCCEEDED

    [(recipients, message)] = mailbox.received
    assert recipients == ["member_a@example.com"]
    assert message["Subject"].startswith("Notebook explore is idle")
    assert message["X-Gpucloud-Event-Id"] == str(notification.event_id)
    assert "Idle for 50 minutes" in message.get_payload()
    delivery.refresh_from_db()
    assert delivery.state == DeliveryState.SUCCEEDED and delivery.sent_at is not None and delivery.attempts == 1


def test_a_webhook_is_signed_and_the_receiver_verifies_it(world: World) -> None:
    with http_receiver([204]) as receiver:
        issued = _hook(world, receiver.url)
        notification = _failed(world)
        delivery = _delivery(notification)
        assert services.send_delivery(delivery_id=delivery.pk) == DeliveryState.SUCCEEDED

    [request] = receiver.requests
    assert request.path == "/hooks/gpucloud"
    assert _receiver_check(issued.secret, request.headers, request.body)
    headers = request.headers
    assert signing.verify(
        issued.secret, header=headers["x-gpucloud-signature"], timestamp=headers["x-gpucloud-timestamp"],
        body=request.body, now=time.time(),
    )  # fmt: skip
    assert not _receiver_check(signing.new_secret(), request.headers, request.body), "another secret does not verify"
    assert not _receiver_check(issued.secret, request.headers, request.body + b" "), "a changed body does not verify"
    assert request.headers["x-gpucloud-event-id"] == str(notification.event_id)
    assert request.headers["x-gpucloud-event"] == "workload.failed"
    assert request.headers["content-type"] == "application/json"
    body = json.loads(request.body)
    assert body["id"] == str(notification.event_id) and body["type"] == "workload.failed"
    assert body["tenant"] == "tenant-a"
    assert body["data"]["workload"] == {"id": 41, "name": "train", "kind": "job"}
    assert body["data"]["owner"] == "member_a" and body["data"]["state"] == "failed"
    delivery.refresh_from_db()
    assert (delivery.state, delivery.last_status, delivery.attempts) == (DeliveryState.SUCCEEDED, 204, 1)


def test_a_receiver_that_fails_twice_gets_retries_with_growing_pauses_then_succeeds(world: World) -> None:
    with http_receiver([500, 502, 200], answer=b"try later") as receiver:
        _hook(world, receiver.url)
        delivery = _delivery(_failed(world))
        start = timezone.now()
        assert services.send_delivery(delivery_id=delivery.pk, now=start) == DeliveryState.PENDING
        delivery.refresh_from_db()
        first_retry = delivery.next_attempt_at
        assert first_retry is not None
        assert services.send_delivery(delivery_id=delivery.pk, now=start) is None, "not due yet: nothing is sent"
        assert services.send_delivery(delivery_id=delivery.pk, now=first_retry) == DeliveryState.PENDING
        delivery.refresh_from_db()
        second_retry = delivery.next_attempt_at
        assert second_retry is not None
        # The periodic run sends what is due, as beat runs it.
        counts = services.send_due_deliveries(now=second_retry)
        assert counts["sent"] == 1

    assert len(receiver.requests) == 3
    assert len({r.headers["x-gpucloud-event-id"] for r in receiver.requests}) == 1, "one event id on every retry"
    delivery.refresh_from_db()
    assert delivery.state == DeliveryState.SUCCEEDED and delivery.attempts == 3 and delivery.last_error == ""
    log = delivery.attempt_log
    assert [entry["status"] for entry in log] == [500, 502, 200]
    assert log[0]["error"] == "HTTP 500: try later"
    assert "retry_at" in log[0] and "retry_at" in log[1] and "retry_at" not in log[2]
    first_pause = (first_retry - start).total_seconds()
    second_pause = (second_retry - first_retry).total_seconds()
    assert 15 <= first_pause <= 30, "half the 30 s base, plus jitter up to the other half"
    assert 30 <= second_pause <= 60 and second_pause >= first_pause, "the pause doubles"


def test_a_receiver_that_always_fails_ends_failed_with_its_last_error(world: World) -> None:
    with http_receiver([503], answer=b"down for maintenance") as receiver:
        _hook(world, receiver.url)
        delivery = _delivery(_failed(world))
        moment = timezone.now()
        states = []
        for _ in range(3):
            states.append(services.send_delivery(delivery_id=delivery.pk, now=moment))
            delivery.refresh_from_db()
            moment = delivery.next_attempt_at or moment
        assert services.send_delivery(delivery_id=delivery.pk, now=moment + timedelta(days=1)) is None

    assert states == [DeliveryState.PENDING, DeliveryState.PENDING, DeliveryState.FAILED]
    assert len(receiver.requests) == 3, "NOTIFICATIONS_MAX_ATTEMPTS is 3 here"
    assert delivery.state == DeliveryState.FAILED and delivery.next_attempt_at is None
    assert (delivery.last_status, delivery.last_error) == (503, "HTTP 503: down for maintenance")
    assert len(delivery.attempt_log) == 3


def test_a_receiver_that_does_not_listen_is_an_error_worth_retrying(world: World) -> None:
    _hook(world, f"http://127.0.0.1:{free_port()}/nobody")
    delivery = _delivery(_failed(world))
    assert services.send_delivery(delivery_id=delivery.pk) == DeliveryState.PENDING
    delivery.refresh_from_db()
    assert "ConnectionRefusedError" in delivery.last_error and delivery.last_status is None


def test_a_slow_receiver_times_out(world: World, settings: Any) -> None:
    settings.NOTIFICATIONS_WEBHOOK_TIMEOUT_SECONDS = 1
    with http_receiver([200]) as receiver:
        _hook(world, receiver.url)
        delivery = _delivery(_failed(world))
        gate = threading.Event()
        original = receiver.next_status

        def slow(request: Any) -> int:
            gate.wait(3)
            return original(request)

        receiver.next_status = slow  # type: ignore[method-assign]
        started = time.monotonic()
        assert services.send_delivery(delivery_id=delivery.pk) == DeliveryState.PENDING
        gate.set()
    assert time.monotonic() - started < 2.5
    delivery.refresh_from_db()
    assert "timed out" in delivery.last_error.lower() or "TimeoutError" in delivery.last_error


def test_running_the_send_task_twice_sends_once(world: World) -> None:
    with http_receiver([200]) as receiver:
        _hook(world, receiver.url)
        delivery = _delivery(_failed(world))
        assert tasks.send_delivery(delivery.pk) == "succeeded"
        assert tasks.send_delivery(delivery.pk) is None
        assert services.send_due_deliveries()["sent"] == 0
    assert len(receiver.requests) == 1


def test_a_removed_or_disabled_endpoint_fails_its_waiting_deliveries_without_calling(world: World) -> None:
    with http_receiver([200]) as receiver:
        issued = _hook(world, receiver.url)
        removed = _delivery(_failed(world))
        services.update_webhook(actor=Actor(user=world.admin_a), endpoint=issued.endpoint, changes={"is_active": False})
        assert services.send_delivery(delivery_id=removed.pk) == DeliveryState.FAILED
    assert receiver.requests == []
    removed.refresh_from_db()
    assert removed.last_error == "The webhook endpoint was turned off."


def test_a_host_that_resolves_to_a_metadata_address_is_refused_at_send_time(world: World, monkeypatch: Any) -> None:
    _hook(world, "http://hooks.example.com/in")
    delivery = _delivery(_failed(world))
    monkeypatch.setattr("socket.getaddrinfo", lambda *args, **kwargs: [(2, 1, 6, "", ("169.254.169.254", 80))])
    assert services.send_delivery(delivery_id=delivery.pk) == DeliveryState.FAILED
    delivery.refresh_from_db()
    assert (
        "hooks.example.com resolves to 169.254.169.254 is a link-local or cloud metadata address" in delivery.last_error
    )
    assert delivery.attempts == 1, "refused for good: no retry"


def test_a_claim_whose_worker_died_is_taken_back(world: World) -> None:
    with http_receiver([200]) as receiver:
        _hook(world, receiver.url)
        delivery = _delivery(_failed(world))
        long_ago = timezone.now() - timedelta(hours=1)
        Delivery.all_tenants.filter(pk=delivery.pk).update(state=DeliveryState.SENDING, claimed_at=long_ago)
        counts = services.send_due_deliveries()
    assert counts["recovered"] == 1 and counts["sent"] == 1
    assert len(receiver.requests) == 1


def test_nobody_listening_writes_nothing(world: World, django_assert_max_num_queries: Any) -> None:
    with django_assert_max_num_queries(2):
        found = services.notify_workload_ended(
            tenant_id=world.tenant_a.pk, owner_id=world.member_a.pk, workload_id=1, name="x", workload_kind="job",
            failed=False, reason_code="exited", message="Completed.",
        )  # fmt: skip
    assert found is None
    assert not Notification.all_tenants.exists()


def test_the_back_off_doubles_up_to_its_cap_and_never_comes_early() -> None:
    pauses = [services.retry_delay(n, base=30, cap=600, unit=0.0).total_seconds() for n in range(1, 8)]
    assert pauses == [15, 30, 60, 120, 240, 300, 300]
    assert services.retry_delay(3, base=30, cap=600, unit=1.0).total_seconds() == 120


def test_an_unknown_kind_is_a_bug_in_the_caller(world: World) -> None:
    with pytest.raises(ValueError, match="is not a valid"):
        services.notify("workload.exploded", tenant=world.tenant_a, subject="s", body="b", payload={})
    with pytest.raises(ValueError, match="not one of a tenant's event kinds"):
        services.notify(EventKind.NODE_HEALTH, tenant=world.tenant_a, subject="s", body="b", payload={})
