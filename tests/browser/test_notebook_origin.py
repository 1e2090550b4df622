"""The attack of issue 32, in Chromium: a member's notebook serves a hostile page, and the tenant admin opens it.

Served as `gpucloud up` serves (`console_and_notebooks`): the console on
one loopback port, the notebook origin on another, where a browser still
sends the console's cookies (cookies are not kept apart by port). The
notebook's upstream is a small server of the test's own that answers what a
malicious Jupyter could: a page whose script tries to read the console's
API and to make its owner a tenant admin with the admin's session, and a
service worker that claims the whole origin and answers every page. Through
the real hand-off and proxy, none of it reaches the console.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tenants.models import Membership
from tests.browser.conftest import console_and_notebooks
from tests.browser.test_console import log_in
from tests.conftest import World
from tests.jobs.test_proxy import notebook

pytestmark = pytest.mark.browser

NOTEBOOK_ID = 4646

# What the notebook's owner serves: it reports what it managed in `window.results`, then sets `window.done`.
ATTACK = """<!doctype html><html><head><title>notebook</title></head><body><h1>analysis</h1><script>
const console_ = %(console)s, member = %(member)d, results = {};
async function attempt(name, work) {
  try { results[name] = await work(); } catch (error) { results[name] = "blocked: " + error.name; }
}
(async () => {
  results.cookies = document.cookie;
  const csrf = (document.cookie.match(/csrftoken=([^;]+)/) || [])[1] || "";
  await attempt("read", async () => {
    const answer = await fetch(console_ + "/api/v1/tenants/tenant-a/memberships/", {credentials: "include"});
    return "read " + answer.status + " " + (await answer.text()).slice(0, 200);
  });
  await attempt("patch", async () => {
    const answer = await fetch(console_ + "/api/v1/tenants/tenant-a/memberships/" + member + "/", {
      method: "PATCH", credentials: "include",
      headers: {"Content-Type": "application/json", "X-CSRFToken": csrf}, body: JSON.stringify({role: "admin"}),
    });
    return "patched " + answer.status;
  });
  await attempt("form", async () => {
    const body = new URLSearchParams({csrfmiddlewaretoken: csrf, ["m" + member + "-role"]: "admin"});
    const answer = await fetch(console_ + "/t/tenant-a/members/" + member + "/", {
      method: "POST", mode: "no-cors", credentials: "include", body,
    });
    return "posted " + answer.type;
  });
  await attempt("worker_root", async () => {
    await navigator.serviceWorker.register("sw.js", {scope: "/"});
    return "registered";
  });
  await attempt("worker_own", async () => {
    const registration = await navigator.serviceWorker.register("sw.js");
    await navigator.serviceWorker.ready;
    return "registered " + registration.scope;
  });
  window.results = results;
  window.done = true;
})();
</script></body></html>"""
WORKER = """self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));
self.addEventListener("fetch", (event) => {
  event.respondWith(new Response("<h1 id=owned>served by the notebook's worker</h1>", {
    headers: {"Content-Type": "text/html"},
  }));
});"""


class Hostile:
    """The notebook's upstream: the attack page at any path, its service worker at `.../sw.js`."""

    def __init__(self) -> None:
        self.console = ""
        self.member = 0
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.endswith("/sw.js"):
                    # Asks for the widest scope: the proxy drops the header, the browser then refuses "/".
                    body, kind, extra = WORKER.encode(), "text/javascript", [("Service-Worker-Allowed", "/")]
                else:
                    page = ATTACK % {"console": json.dumps(hostile.console), "member": hostile.member}
                    body, kind, extra = page.encode(), "text/html", []
                self.send_response(200)
                for name, value in [("Content-Type", kind), ("Content-Length", str(len(body))), *extra]:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    upstream = Hostile()
    thread = threading.Thread(target=upstream.server.serve_forever, daemon=True)
    thread.start()
    yield upstream
    upstream.server.shutdown()
    upstream.server.server_close()


def test_a_members_notebook_opened_by_the_tenant_admin_can_neither_read_nor_act_on_the_console(
    live_world: World, browser: Any, hostile: Hostile
) -> None:
    world = live_world
    notebook(world, NOTEBOOK_ID, hostile.endpoint)  # member_a's
    membership = Membership.all_tenants.get(tenant=world.tenant_a, user=world.member_a)
    with console_and_notebooks() as (console, notebooks):
        hostile.console, hostile.member = console, membership.pk
        context = browser.new_context(base_url=console)
        page = context.new_page()
        log_in(page, "admin_a")
        page.wait_for_url("**/t/tenant-a/")

        # The admin opens the member's notebook from the console: the hand-off lands on the notebook origin.
        page.goto(f"/notebooks/{NOTEBOOK_ID}/open")
        page.wait_for_function("window.done === true", timeout=30_000)
        assert page.url == f"{notebooks}/notebooks/{NOTEBOOK_ID}/lab", page.url
        results = page.evaluate("window.results")

        assert results["read"].startswith("blocked"), results  # no CORS: the console's answer stays unreadable
        assert results["patch"].startswith("blocked"), results  # its preflight is refused: the PATCH never left
        assert "sessionid" not in results["cookies"] and "gpucloud_notebook" not in results["cookies"], results
        membership.refresh_from_db()
        assert membership.role == "member", "neither the PATCH nor the form post made the owner an admin"

        # A service worker may claim the notebook's own path on the notebook origin, never more.
        assert results["worker_root"].startswith("blocked: SecurityError"), results
        assert results["worker_own"] == f"registered {notebooks}/notebooks/{NOTEBOOK_ID}/", results
        inside = context.new_page()
        inside.goto(f"{notebooks}/notebooks/{NOTEBOOK_ID}/anything")
        assert inside.locator("#owned").count() == 1, "the worker is real and answers inside its scope"

        # The console's pages are another origin: the worker controls none of them.
        console_page = context.new_page()
        console_page.goto(f"{console}/t/tenant-a/")
        assert console_page.evaluate("navigator.serviceWorker.controller") is None
        assert console_page.locator("#owned").count() == 0
        assert console_page.locator("h2").first.inner_text() == "Tenant A"
        context.close()
