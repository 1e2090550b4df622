"""The login lockout (django-axes) through real logins on the console's login page.

Failures count per (username, address); a lockout refuses even the right
password. tests/frontend/test_pages.py and tests/tenants/test_admin.py prove
the console's and the admin's refusals; tests/gpucloud/test_workers.py that
the counts live in Redis when distributed.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client

from tenants.services import clear_login_failures, login_locked_for
from tests.conftest import PASSWORD, World


@pytest.fixture(autouse=True)
def _lockout_on(settings: Any) -> None:
    settings.AXES_ENABLED = True
    settings.AXES_FAILURE_LIMIT = 3


def login(username: str, password: str, address: str = "127.0.0.1") -> Client:
    client = Client(REMOTE_ADDR=address)
    client.post("/login/", {"username": username, "password": password})
    return client


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def fail(times: int, username: str = "member_a", address: str = "127.0.0.1") -> None:
    for _ in range(times):
        assert not logged_in(login(username, "wrong", address))


def test_the_failure_that_reaches_the_limit_locks_the_pair_out(world: World) -> None:
    fail(2)
    response = Client().post("/login/", {"username": "member_a", "password": "wrong"})
    assert response.status_code == 429
    assert not logged_in(login("member_a", PASSWORD))
    assert login_locked_for("member_a", "127.0.0.1") > 0


def test_another_address_and_another_account_are_not_locked(world: World) -> None:
    fail(3)
    assert logged_in(login("member_a", PASSWORD, address="10.0.0.2"))
    assert logged_in(login("viewer_a", PASSWORD))


def test_usernames_count_whatever_their_case_and_spaces(world: World) -> None:
    fail(1, "Member_A")
    fail(1, " member_a ")
    fail(1, "MEMBER_A")
    assert not logged_in(login("member_a", PASSWORD))


def test_a_success_clears_the_count(world: World) -> None:
    fail(2)
    assert logged_in(login("member_a", PASSWORD))
    fail(2)
    assert logged_in(login("member_a", PASSWORD))


def test_the_lockout_ends_after_its_time_and_refused_attempts_do_not_extend_it(world: World, settings: Any) -> None:
    settings.AXES_COOLOFF_TIME = timedelta(seconds=1)
    fail(3)
    time.sleep(0.5)
    assert not logged_in(login("member_a", PASSWORD))
    time.sleep(0.6)
    assert logged_in(login("member_a", PASSWORD))


def test_clearing_the_failures_lifts_the_lockout(world: World) -> None:
    fail(3)
    clear_login_failures("Member_A", "127.0.0.1")
    assert logged_in(login("member_a", PASSWORD))
