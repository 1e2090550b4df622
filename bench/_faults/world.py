"""The world a fault run needs, and the REST API client that drives it as a user's automation would.

The accounts and quotas are written once, before the console starts, by a
short Django script run from the measured code tree (`bootstrap`): an
operator and a tenant admin, each with an API token, tenant `faults` with
project `work`, pool `faults` (3 s stop grace) and a quota of every GPU.
Everything after that goes through the REST API: nodes are registered and
provisioned by the operator's token (the agents probe them: simulated GPUs,
process runtime), workloads are submitted, read, their logs fetched and
notebooks cancelled with the tenant admin's token (`Submitter` submits on a
thread of its own at planned times, as a client keeps doing while the
console fails), and notebooks are opened through the console's proxy with a
browser session of the same user.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from _faults.procs import PYTHON
from _faults.truth import Design

TENANT = "faults"
PROJECT = "work"
POOL = "faults"
OWNER = "faults-owner"
PASSWORD = "faults-password-0123456789"  # noqa: S105 -- a scratch account of a scratch console

_BOOTSTRAP = """
import json, os, django
django.setup()
from django.core.management import call_command
call_command("migrate", interactive=False, verbosity=0)
call_command("collectstatic", interactive=False, verbosity=0)
from django.contrib.auth.models import User
from inventory.models import NodePool
from tenants.context import SYSTEM, Actor
from tenants.models import Membership, Project, ProjectQuota, Tenant, TenantQuota
from tenants.services import create_operator
from tenants.services.tokens import create_token
password, gpus = os.environ["FAULTS_PASSWORD"], int(os.environ["FAULTS_GPUS"])
operator = create_operator(actor=SYSTEM, username="faults-operator", password=password)
owner = User.objects.create_user(os.environ["FAULTS_OWNER"], password=password)
tenant = Tenant.objects.create(slug=os.environ["FAULTS_TENANT"], name="Faults")
Membership.all_tenants.create(tenant=tenant, user=owner, role="admin")
pool = NodePool.objects.create(name=os.environ["FAULTS_POOL"], stop_grace_seconds=3)
project = Project.all_tenants.create(tenant=tenant, slug=os.environ["FAULTS_PROJECT"], name="Work")
TenantQuota.all_tenants.create(tenant=tenant, pool=pool, guaranteed=gpus, limit=gpus)
ProjectQuota.all_tenants.create(tenant=tenant, project=project, pool=pool, guaranteed=gpus, limit=gpus)
operator_token = create_token(actor=Actor(user=operator), tenant=None, name="f", role="operator", expires_in_days=7)
owner_token = create_token(actor=Actor(user=owner), tenant=tenant, name="f", role="admin", expires_in_days=7)
print("FAULTS-WORLD " + json.dumps({"operator": operator_token.secret, "owner": owner_token.secret}))
"""


def bootstrap(*, code: Path, env: dict[str, str], gpus: int) -> dict[str, str]:
    """Migrate, collect static files (as a deployment does before `serve`), create the accounts, tenant, pool and
    quotas; return the two API tokens."""
    extra = {
        "FAULTS_PASSWORD": PASSWORD,
        "FAULTS_GPUS": str(gpus),
        "FAULTS_OWNER": OWNER,
        "FAULTS_TENANT": TENANT,
        "FAULTS_POOL": POOL,
        "FAULTS_PROJECT": PROJECT,
    }
    result = subprocess.run(
        [PYTHON, "-c", _BOOTSTRAP],
        cwd=code,
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    for line in result.stdout.splitlines():
        if line.startswith("FAULTS-WORLD "):
            tokens: dict[str, str] = json.loads(line.removeprefix("FAULTS-WORLD "))
            return tokens
    raise RuntimeError(f"bootstrap failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}")


class Api:
    """The REST API with one bearer token; calls raise httpx.HTTPError when the console does not answer."""

    def __init__(self, base: str, token: str) -> None:
        self.base = base
        self.client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=15)

    def get(self, path: str, **params: Any) -> Any:
        answer = self.client.get(path, params=params)
        answer.raise_for_status()
        return answer.json()

    def post(self, path: str, body: dict[str, Any] | None = None, **headers: str) -> httpx.Response:
        return self.client.post(path, json=body or {}, headers=headers)

    # --- nodes (operator) ---------------------------------------------------------------------------

    def add_node(self, name: str, *, runtime: str, timeout: float) -> int:
        """Register a node and provision it through its agent; return its GPU count once ready."""
        answer = self.post("/api/v1/nodes/", {"name": name, "pool": POOL, "runtime": runtime})
        if answer.status_code not in (200, 201):
            raise RuntimeError(f"registering node {name}: {answer.status_code} {answer.text}")
        answer = self.post(f"/api/v1/nodes/{name}/provision/")
        if answer.status_code >= 300:
            raise RuntimeError(f"provisioning node {name}: {answer.status_code} {answer.text}")
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.get(f"/api/v1/nodes/{name}/")["state"]
            if state == "ready":
                return len(self.get(f"/api/v1/nodes/{name}/gpus/"))
            if state == "failed":
                break
            time.sleep(0.5)
        raise RuntimeError(f"node {name} is {state!r}, not ready: {self.get(f'/api/v1/nodes/{name}/')}")

    # --- workloads (tenant admin) -------------------------------------------------------------------

    def submit(self, payload: dict[str, Any], *, deadline: float) -> tuple[int | None, int]:
        """Submit with an Idempotency-Key (the workload's name), retrying until accepted or `deadline`.

        Returns (workload id or None, failed tries). A retry after a lost
        answer gets the first submission back, never a duplicate.
        """
        body = {"project": PROJECT, "pool": POOL, **payload}
        failures = 0
        while True:
            try:
                answer = self.post(f"/api/v1/tenants/{TENANT}/workloads/", body, **{"Idempotency-Key": payload["name"]})
                if answer.status_code in (200, 201):
                    return int(answer.json()["id"]), failures
                if answer.status_code < 500 and answer.status_code != 429:
                    raise RuntimeError(f"submission of {payload['name']} refused: {answer.status_code} {answer.text}")
            except httpx.HTTPError:
                pass
            failures += 1
            if time.monotonic() >= deadline:
                return None, failures
            time.sleep(1.0)

    def cancel(self, workload_id: int) -> int:
        return self.post(f"/api/v1/tenants/{TENANT}/workloads/{workload_id}/cancel/").status_code

    def log_lines(self, workload_id: int) -> list[dict[str, Any]]:
        """Return every stored log line of the workload, all attempts, through the logs endpoint."""
        lines: list[dict[str, Any]] = []
        since = 0
        while True:
            page = self.get(f"/api/v1/tenants/{TENANT}/workloads/{workload_id}/logs/", since=since, limit=5000)
            lines += page["lines"]
            if not page["lines"] or page.get("next_since") in (None, since):
                return lines
            since = int(page["next_since"])

    def pool_free(self) -> int | None:
        """Return the free GPUs of the pool as the API shows them (None when it cannot say)."""
        for pool in self.get("/api/v1/node-pools/").get("results", []):
            if pool["name"] == POOL:
                return sum(int(entry["free"]) for entry in pool["capacity"])
        return None


def browser_session(base: str) -> httpx.Client:
    """Return a client logged in to the console's pages as the tenant admin (the notebook proxy's check)."""
    client = httpx.Client(base_url=base, timeout=15, follow_redirects=False)
    client.get("/login/")
    csrf = client.cookies.get("csrftoken", "")
    answer = client.post(
        "/login/",
        data={"username": OWNER, "password": PASSWORD, "csrfmiddlewaretoken": csrf},
        headers={"Referer": f"{base}/login/"},
    )
    if answer.status_code not in (301, 302, 303):
        raise RuntimeError(f"login as {OWNER} failed: {answer.status_code}")
    return client


def proxy_serves(session: httpx.Client, workload_id: int) -> bool:
    """Return True when the notebook answers its status URL through the console's hand-off and proxy.

    The console's `/notebooks/<id>/open` redirects to the notebook origin's one-time entry, which sets the
    notebook's own cookie and redirects to the path asked for.
    """
    try:
        handed = session.get(f"/notebooks/{workload_id}/open", params={"next": "api/status"})
        if handed.status_code != 302:
            return False
        return session.get(handed.headers["location"], follow_redirects=True).status_code == 200
    except httpx.HTTPError:
        return False


class Submitter:
    """Submits planned workloads at their times on a thread of its own, as a client would, retrying each."""

    def __init__(self, api: Api, run_id: str, proof_dir: Path, patience: float, image: str | None) -> None:
        self.api = api
        self.image = image
        self.run_id = run_id
        self.proof_dir = proof_dir
        self.patience = patience
        self.accepted: dict[str, int] = {}
        self.never_accepted: list[str] = []
        self.failed_tries = 0
        self._plan: queue.Queue[tuple[float, Design] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="faults-submitter", daemon=True)
        self._thread.start()

    def plan(self, design: Design, at: float) -> None:
        self._plan.put((at, design))

    def close(self, timeout: float) -> None:
        """Stop once everything planned was submitted (or given up on)."""
        self._plan.put(None)
        self._thread.join(timeout=timeout)

    def _run(self) -> None:
        while (item := self._plan.get()) is not None:
            at, design = item
            time.sleep(max(0.0, at - time.monotonic()))
            # A container cannot write the host's proof directory: with an image of its own (the docker runtime)
            # a job writes none, and the ledger's attempt stands for it (report.log_figures).
            proof = None if self.image else self.proof_dir
            payload = design.payload(run_id=self.run_id, proof_dir=proof, image=self.image)
            workload_id, failures = self.api.submit(payload, deadline=time.monotonic() + self.patience)
            self.failed_tries += failures
            if workload_id is None:
                self.never_accepted.append(design.name)
            else:
                self.accepted[design.name] = workload_id
