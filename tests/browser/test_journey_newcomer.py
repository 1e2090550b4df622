"""The newcomer's journey: `gpucloud up --demo` on an empty database, then the console in Chromium.

What the first start does is done as it does it: the first operator with a
generated password read off the closing banner (`gpucloud.cli`), and the
demo fleet through the same service (`jobs.services.demo`). A control
worker runs the scheduler, launches on the simulated nodes and takes their
reports, as the console's embedded worker does; the simulated nodes'
heartbeats are what beat's `inventory.heartbeat_simulated_nodes` sends.
Everything else the newcomer only looks at.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from gpucloud.banner import render
from gpucloud.cli import _ensure_first_operator
from inventory.tasks import heartbeat_simulated_nodes
from jobs.services.demo import DEMO_TENANT, add_demo_fleet
from tenants.context import Actor
from tests.browser.conftest import wait_for_true
from tests.browser.journey import Journey
from tests.workers import running_worker

pytestmark = pytest.mark.browser

ALLOCATED_WITHIN = 60_000  # ms: "GPUs allocated by the scheduler within a minute"


def _first_start(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """Do what `gpucloud up --demo` does on an empty database; return the user name and password it printed."""
    from django.contrib.auth.models import User

    monkeypatch.delenv("GPUCLOUD_ADMIN_PASSWORD", raising=False)
    monkeypatch.delenv("GPUCLOUD_ADMIN_USERNAME", raising=False)
    sign_in = _ensure_first_operator()
    fleet = add_demo_fleet(actor=Actor(user=User.objects.get(username=sign_in.username)))
    banner = render(url="http://127.0.0.1:8000", sign_in=sign_in, this_machine="", demo=fleet.summary())
    user = re.search(r"User name: +(\S+)", banner)
    password = re.search(r"Password: +(\S+)", banner)
    assert user and password, banner
    return user.group(1), password.group(1)


def _heartbeat() -> None:
    """What beat runs every few seconds: the simulated nodes' heartbeats, their samples published to live views."""
    heartbeat_simulated_nodes()


def _heartbeat_until(page: Any, condition: str) -> None:
    """Heartbeat every half second, as beat would, until `condition` holds on the page (10 s at most)."""
    deadline = time.monotonic() + 10
    while True:
        _heartbeat()
        try:
            wait_for_true(page, condition, timeout=500)
            return
        except PlaywrightTimeout:
            assert time.monotonic() < deadline, f"never true: {condition}"


def test_a_newcomer_tries_the_demo_fleet(transactional_db: None, live_page: Any, monkeypatch: Any) -> None:
    page = live_page
    journey = Journey("newcomer", "A newcomer tries the demo fleet")
    with running_worker(["control"], concurrency=4):
        username, password = _first_start(monkeypatch)

        page.goto("/login/")
        assert page.get_by_role("button", name=re.compile("log in|sign in", re.I)).is_visible()
        journey.step(page, "The login page of a console just started with make run DEMO=1")

        page.locator("input[name=username]").fill(username)
        page.locator("input[name=password]").fill(password)
        page.get_by_role("button", name=re.compile("log in|sign in", re.I)).click()
        page.wait_for_url(lambda url: "/login/" not in url)
        journey.step(page, "Signed in with the user name and password the console printed")

        _heartbeat()
        page.goto("/ops/cluster/")
        cluster = page.locator("[data-heatmap-pools]")
        pool = cluster.locator("section[data-pool=sim-demo]")
        pool.wait_for()
        assert "4 nodes, all simulated" in pool.locator("h3").inner_text()
        assert pool.locator("[data-node-sim]").count() == 4, "every demo node carries the simulated badge"
        page.locator(".hm-cell.hm-held").first.wait_for(timeout=ALLOCATED_WITHIN)
        assert page.locator(".hm-cell.hm-held").count() >= 8
        journey.step(page, "The cluster: simulated nodes, GPUs the scheduler allocated to demo jobs")

        page.goto(f"/t/{DEMO_TENANT}/queue/")
        waiting = page.locator("#waiting tr[data-workload]")
        waiting.first.wait_for()
        reasons = waiting.locator("td strong").all_inner_texts()
        assert reasons and all(reason.strip() for reason in reasons), reasons
        assert "sim-" in waiting.first.inner_text()
        journey.step(page, "The queue: demo work waiting, each with the reason it waits")

        page.goto("/ops/nodes/sim-h100-01/")
        assert page.locator("#simulated-note").is_visible()
        page.locator("#gpu-chart[data-synced=true]").wait_for()
        _heartbeat_until(page, "Number(document.querySelector('#gpu-chart').dataset.points) >= 16")
        journey.step(page, "A simulated node's GPU charts, live")
