"""Agent reports travel through the broker (Redis in CI, the in-process transport otherwise) in batches."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from django.conf import settings

from inventory import mailbox, services
from inventory.tasks import apply_heartbeats
from tenants.context import Actor
from tests.conftest import World
from tests.inventory.factories import make_node


@pytest.fixture(autouse=True)
def _empty_mailbox() -> Iterator[None]:
    mailbox.drain_reports(lambda reports: None)
    yield
    mailbox.drain_reports(lambda reports: None)


def test_reports_posted_are_drained_once_as_one_batch() -> None:
    for i in range(5):
        mailbox.post_report({"node": f"n{i}", "sent_at": time.time()})
    batches: list[list[str]] = []
    assert mailbox.drain_reports(lambda reports: batches.append([r["node"] for r in reports])) == 5
    assert batches == [["n0", "n1", "n2", "n3", "n4"]]
    assert mailbox.drain_reports(lambda reports: batches.append([])) == 0


def test_a_failing_batch_does_not_block_the_mailbox() -> None:
    mailbox.post_report({"node": "poison", "sent_at": time.time()})

    def explode(reports: object) -> None:
        raise RuntimeError("boom")

    assert mailbox.drain_reports(explode) == 1
    assert mailbox.drain_reports(lambda reports: None) == 0


@pytest.mark.redis
def test_the_mailbox_is_a_redis_queue() -> None:
    assert settings.CELERY_BROKER_URL.startswith("redis://")
    import redis

    mailbox.post_report({"node": "r1", "sent_at": time.time()})
    assert settings.REDIS_URL
    assert redis.Redis.from_url(settings.REDIS_URL).llen(mailbox.QUEUE) == 1


def test_apply_heartbeats_applies_fresh_reports_and_skips_stale_ones(world: World) -> None:
    operator = Actor(user=world.operator)
    fresh = make_node(operator, world.pool, name="fresh")
    stale = make_node(operator, world.pool, name="stale")
    mailbox.post_report({"node": "fresh", "agent_version": "1.2", "sent_at": time.time()})
    old = time.time() - settings.NODE_HEARTBEAT_TIMEOUT_SECONDS - 1
    mailbox.post_report({"node": "stale", "agent_version": "1.2", "sent_at": old})
    assert apply_heartbeats() == 2
    fresh.refresh_from_db()
    stale.refresh_from_db()
    assert fresh.last_heartbeat_at is not None and fresh.agent_version == "1.2"
    assert stale.last_heartbeat_at is None


def test_apply_heartbeats_is_single_flight(world: World) -> None:
    from django.core.cache import cache

    from inventory.tasks import HEARTBEAT_LOCK

    mailbox.post_report({"node": "n1", "sent_at": time.time()})
    cache.add(HEARTBEAT_LOCK, 1)
    assert apply_heartbeats() == 0
    cache.delete(HEARTBEAT_LOCK)
    assert apply_heartbeats() == 1
    assert services.record_heartbeats([]) == 0
