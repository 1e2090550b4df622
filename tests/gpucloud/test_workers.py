"""Celery tasks run by a real worker thread, through the configured broker.

In embedded mode that is Celery's in-process transport; with REDIS_URL set
the same worker consumes from Redis, and the `redis` test proves it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone

from gpucloud.celery import app
from tenants.tasks import purge_expired_sessions
from tests.workers import running_worker, wait_until


@pytest.fixture(scope="module")
def worker() -> Iterator[object]:
    with running_worker(["control"]) as controller:
        yield controller


def _expired_session() -> str:
    store = SessionStore()
    store.create()
    Session.objects.filter(pk=store.session_key).update(expire_date=timezone.now() - timedelta(days=1))
    return str(store.session_key)


@pytest.mark.django_db(transaction=True)
def test_worker_runs_a_queued_task(worker: object) -> None:
    expired = _expired_session()
    live = SessionStore()
    live.create()
    purge_expired_sessions.delay()
    assert wait_until(lambda: not Session.objects.filter(pk=expired).exists()), "the worker never ran the task"
    assert Session.objects.filter(pk=live.session_key).exists()


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_tasks_travel_through_redis(worker: object) -> None:
    assert app.conf.broker_url.startswith("redis://")
    expired = _expired_session()
    result = purge_expired_sessions.delay()
    assert result.ignored, "no result is kept: sending never subscribes to one"
    assert wait_until(lambda: not Session.objects.filter(pk=expired).exists()), "the worker never ran the task"


@pytest.mark.redis
def test_channel_layer_round_trips_through_redis() -> None:
    assert settings.CHANNEL_LAYERS["default"]["BACKEND"] == "channels_redis.core.RedisChannelLayer"
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.send)(channel, {"type": "probe", "value": 42})
    assert async_to_sync(layer.receive)(channel) == {"type": "probe", "value": 42}


@pytest.mark.redis
def test_login_lockout_state_is_shared_through_redis(db: None, settings: Any) -> None:
    assert settings.CACHES["default"]["BACKEND"] == "django.core.cache.backends.redis.RedisCache"
    settings.AXES_ENABLED = True
    for _ in range(settings.AXES_FAILURE_LIMIT):
        Client().post("/login/", {"username": "redis-probe", "password": "wrong"})
    prefix = settings.CACHES["default"]["KEY_PREFIX"]
    assert redis.Redis.from_url(settings.REDIS_URL).keys(f"{prefix}:*axes-*"), "failures must be counted in Redis"
    response = Client().post("/login/", {"username": "redis-probe", "password": "wrong"})
    assert "Too many failed attempts" in response.content.decode()


@pytest.mark.redis
def test_every_broker_socket_has_a_read_timeout() -> None:
    """A worker closing its channel reads the reply to its outstanding BRPOP; on a connection whose peer went
    silent that read must end (and the worker reconnect) instead of blocking for good (Celery GH-9705)."""
    with app.connection_for_write() as connection:
        channel: Any = connection.default_channel
        pool = channel.client.connection_pool
        assert pool.connection_kwargs["socket_timeout"] == 30
        live = pool.get_connection("PING")
        try:
            live.connect()
            assert live._sock is not None and live._sock.gettimeout() == 30
        finally:
            pool.release(live)
