"""/metrics: DCGM GPU readings labelled with their holder, console metrics, access rules, query count, dashboard."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from common.protocol.messages import LogBatches, Reconcile
from inventory.choices import NodeState
from inventory.models import Gpu, Node, NodePool
from inventory.services import record_heartbeats
from jobs import services
from jobs.metrics import PASS_DURATION_BUCKETS, record_pass_duration
from jobs.models import Allocation, Workload
from tenants.context import Actor
from tests.conftest import World
from tests.inventory.factories import make_node
from tests.jobs.factories import add_node, ready_world, request, run_pass_now

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "compose" / "grafana" / "dashboards" / "gpucloud.json"
TOKEN = "metrics-token-0123456789abcdef"
DCGM = [
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
]


def _sample(uuid: str, index: int, **fields: Any) -> dict[str, Any]:
    return {
        "uuid": uuid,
        "index": index,
        "timestamp": 0.0,
        "utilization_gpu": 10.0 * index,
        "utilization_memory": 5.0,
        "memory_used_mib": 1000 + index,
        "memory_total_mib": 81559,
        "temperature_c": 40.0 + index,
        "power_w": 100.5 + index,
        "sm_clock_mhz": 1980,
        "ecc_corrected": 2,
        "ecc_uncorrected": 0,
        "xid_events": [],
        **fields,
    }


def _placeable(world: World) -> World:
    """ready_world, its node given CPU and memory for the scheduler to reserve."""
    ready_world(world)
    Node.objects.filter(name="n1").update(cpu_cores=64, memory_mib=512_000)
    return world


def _seed(world: World) -> Workload:
    """n1 (ready, 8 H100s sampled, one of them stale and one no longer present) runs a 2-GPU job;
    a 6-GPU job waits (5 free); n2 is cordoned in pool `other` and has never reported."""
    _placeable(world)
    samples = [_sample(f"GPU-n1-{i}", i) for i in range(8)]
    samples[3]["xid_events"] = [13, 31]
    assert record_heartbeats([{"node": "n1", "agent_version": "1.0", "samples": samples}]) == 1
    Gpu.objects.filter(uuid="GPU-n1-6").update(last_sample_at=timezone.now() - timedelta(minutes=5))
    Gpu.objects.filter(uuid="GPU-n1-7").update(present=False)
    make_node(Actor(user=world.operator), NodePool.objects.create(name="other"), name="n2", state=NodeState.CORDONED)
    running = services.submit_workload(
        actor=Actor(user=world.member_a), project=world.project_a, data=request(world, gpus_per_replica=2)
    )
    run_pass_now()
    services.submit_workload(
        actor=Actor(user=world.member_a), project=world.project_a, data=request(world, name="big", gpus_per_replica=6)
    )
    run_pass_now()
    return running


def _scrape(client: Client, **headers: Any) -> dict[str, Any]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return {family.name: family for family in text_string_to_metric_families(response.content.decode())}


def _by(family: Any, key: str) -> dict[str, tuple[dict[str, str], float]]:
    return {sample.labels[key]: (sample.labels, sample.value) for sample in family.samples}


def test_gpu_readings_under_dcgm_names_labelled_with_the_holder(world: World, client: Client) -> None:
    running = _seed(world)
    held = set(Allocation.all_tenants.filter(workload=running).values_list("gpu__uuid", flat=True))
    assert len(held) == 2
    families = _scrape(client)
    assert set(DCGM) <= families.keys()
    util = _by(families["DCGM_FI_DEV_GPU_UTIL"], "UUID")
    # The stale GPU (sample older than the heartbeat timeout) and the absent one are not reported.
    assert sorted(util) == [f"GPU-n1-{i}" for i in range(6)]
    for uuid, (labels, value) in util.items():
        index = int(uuid.rsplit("-", 1)[1])
        assert value == 10.0 * index
        holder = ("tenant-a", "alpha", str(running.pk)) if uuid in held else ("", "", "")
        assert labels == {
            "gpu": str(index),
            "UUID": uuid,
            "device": f"nvidia{index}",
            "modelName": "NVIDIA H100 80GB HBM3",
            "Hostname": "n1",
            "pool": "shared",
            "tenant": holder[0],
            "project": holder[1],
            "workload": holder[2],
        }
    values = {name: {u: v for u, (_, v) in _by(families[name], "UUID").items()} for name in DCGM}
    assert values["DCGM_FI_DEV_FB_USED"]["GPU-n1-2"] == 1002
    assert values["DCGM_FI_DEV_FB_FREE"]["GPU-n1-2"] == 81559 - 1002
    assert values["DCGM_FI_DEV_POWER_USAGE"]["GPU-n1-2"] == 102.5
    assert values["DCGM_FI_DEV_GPU_TEMP"]["GPU-n1-2"] == 42.0
    assert values["DCGM_FI_DEV_SM_CLOCK"]["GPU-n1-2"] == 1980
    assert values["DCGM_FI_DEV_MEM_COPY_UTIL"]["GPU-n1-2"] == 5.0
    assert values["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"]["GPU-n1-2"] == 2
    assert values["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]["GPU-n1-2"] == 0
    assert (values["DCGM_FI_DEV_XID_ERRORS"]["GPU-n1-3"], values["DCGM_FI_DEV_XID_ERRORS"]["GPU-n1-2"]) == (31, 0)


def test_readings_a_sample_lacks_are_left_out(world: World, client: Client) -> None:
    add_node(world, gpus=1)
    lost = {"uuid": "GPU-n1-0", "index": 0, "timestamp": 0.0, "lost": True, "xid_events": [79]}
    record_heartbeats([{"node": "n1", "samples": [lost]}])
    families = _scrape(client)
    present = {name for name in DCGM if families[name].samples}
    assert present == {"DCGM_FI_DEV_XID_ERRORS"}
    assert families["DCGM_FI_DEV_XID_ERRORS"].samples[0].value == 79


def test_console_metrics(world: World, client: Client) -> None:
    _seed(world)
    families = _scrape(client)
    workloads = {(s.labels["pool"], s.labels["state"]): s.value for s in families["gpucloud_workloads"].samples}
    assert workloads[("shared", "scheduled")] == 1
    assert workloads[("shared", "pending")] == 1
    assert workloads[("other", "pending")] == 0  # every pool is listed, so an empty queue reads 0, not "no data"
    assert "succeeded" not in {state for _, state in workloads}
    allocated = {(s.labels["pool"], s.labels["tenant"]): s.value for s in families["gpucloud_allocated_gpus"].samples}
    assert allocated == {("shared", "tenant-a"): 2}
    gpus = {
        (s.labels["pool"], s.labels["model"], s.labels["health"]): s.value for s in families["gpucloud_gpus"].samples
    }
    assert gpus == {("shared", "NVIDIA H100 80GB HBM3", "ok"): 7}
    nodes = {(s.labels["pool"], s.labels["state"]): s.value for s in families["gpucloud_nodes"].samples}
    assert (nodes[("shared", "ready")], nodes[("other", "cordoned")], nodes[("other", "ready")]) == (1, 1, 0)
    assert sum(nodes.values()) == 2
    heartbeats = _by(families["gpucloud_node_last_heartbeat_timestamp_seconds"], "node")
    assert set(heartbeats) == {"n1"}  # n2 never reported
    last = Node.objects.get(name="n1").last_heartbeat_at
    assert last is not None and heartbeats["n1"][1] == pytest.approx(last.timestamp())


def _histogram(client: Client) -> dict[str, float]:
    family = _scrape(client)["gpucloud_scheduling_pass_duration_seconds"]
    assert family.type == "histogram"
    values = {s.labels.get("le", s.name): s.value for s in family.samples}
    return values


def test_pass_durations_grow_with_real_passes(world: World, client: Client) -> None:
    before = _histogram(client)
    ready_world(world)
    run_pass_now()
    run_pass_now()
    after = _histogram(client)
    count = "gpucloud_scheduling_pass_duration_seconds_count"
    assert after[count] == before[count] + 2
    assert after["+Inf"] == after[count]
    assert (
        after["gpucloud_scheduling_pass_duration_seconds_sum"] > before["gpucloud_scheduling_pass_duration_seconds_sum"]
    )
    bounds = [str(b) for b in PASS_DURATION_BUCKETS] + ["+Inf"]
    assert [after[b] for b in bounds] == sorted(after[b] for b in bounds)  # cumulative


def test_pass_duration_buckets_are_cumulative_upper_bounds(client: Client) -> None:
    for seconds in (0.003, 0.005, 0.2, 30.0):
        record_pass_duration(seconds)
    values = _histogram(client)
    assert (values["0.005"], values["0.01"], values["0.1"], values["0.25"], values["10.0"], values["+Inf"]) == (
        2, 2, 2, 3, 3, 4,
    )  # fmt: skip
    assert values["gpucloud_scheduling_pass_duration_seconds_sum"] == pytest.approx(30.208)


@pytest.mark.redis
def test_passes_in_another_process_reach_this_ones_scrape(client: Client, settings: Any) -> None:
    """A controller worker is another process: what it records, the web process reads (through Redis)."""
    prefix = settings.CACHES["default"]["KEY_PREFIX"]
    code = (
        "import django; from django.conf import settings; django.setup(); "
        f"settings.CACHES['default']['KEY_PREFIX'] = {prefix!r}; "
        "from jobs.metrics import record_pass_duration; record_pass_duration(0.3); record_pass_duration(0.02)"
    )
    environ = {**os.environ, "DJANGO_SETTINGS_MODULE": "gpucloud.settings"}
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    values = _histogram(client)
    assert (values["0.01"], values["0.025"], values["0.25"], values["0.5"], values["+Inf"]) == (0, 1, 1, 2, 2)
    assert values["gpucloud_scheduling_pass_duration_seconds_sum"] == pytest.approx(0.32)


def test_a_cache_outage_loses_the_observation_not_the_pass(world: World, settings: Any) -> None:
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"}
    }
    _placeable(world)
    services.submit_workload(actor=Actor(user=world.member_a), project=world.project_a, data=request(world))
    run_pass_now()
    assert Allocation.all_tenants.count() == 1


def test_openmetrics_when_asked(world: World, client: Client) -> None:
    _seed(world)
    response = client.get("/metrics", HTTP_ACCEPT="application/openmetrics-text; version=1.0.0")
    assert response["Content-Type"].startswith("application/openmetrics-text")
    names = {family.name for family in openmetrics_families(response.content.decode())}
    assert {"DCGM_FI_DEV_GPU_UTIL", "gpucloud_scheduling_pass_duration_seconds"} <= names


# --- access ------------------------------------------------------------------------------


def _status(client: Client, address: str, token: str | None = None, **headers: Any) -> int:
    if token is not None:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    response = client.get("/metrics", REMOTE_ADDR=address, **headers)
    if response.status_code != 200:
        assert b"DCGM" not in response.content and b"gpucloud_" not in response.content
        assert response["Content-Type"].startswith("text/plain") and response.content.count(b"\n") == 1
    return response.status_code


@pytest.mark.parametrize(
    ("address", "status"),
    [("127.0.0.1", 200), ("127.3.4.5", 200), ("::1", 200), ("::ffff:127.0.0.1", 200), ("10.0.0.5", 403), ("", 403)],
)
def test_without_settings_only_loopback(client: Client, address: str, status: int) -> None:
    assert _status(client, address) == status


def test_a_token_opens_it_to_any_address_that_sends_it(client: Client, settings: Any) -> None:
    settings.METRICS_TOKEN = TOKEN
    assert _status(client, "10.0.0.5", TOKEN) == 200
    assert _status(client, "127.0.0.1") == 401
    assert _status(client, "10.0.0.5", TOKEN + "x") == 401
    assert _status(client, "10.0.0.5", HTTP_AUTHORIZATION=f"Token {TOKEN}") == 401
    response = client.get("/metrics", REMOTE_ADDR="10.0.0.5")
    assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert response.content == b"/metrics needs the header Authorization: Bearer <METRICS_TOKEN>.\n"


def test_allowed_networks(client: Client, settings: Any) -> None:
    settings.METRICS_ALLOWED_NETWORKS = ["10.1.0.0/16", "fd00::/8"]
    assert _status(client, "10.1.2.3") == 200
    assert _status(client, "fd00::5") == 200
    assert _status(client, "10.2.0.1") == 403
    assert _status(client, "127.0.0.1") == 403  # the networks replace the loopback default


def test_with_both_settings_both_must_pass(client: Client, settings: Any) -> None:
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOWED_NETWORKS = ["10.1.0.0/16"]
    assert _status(client, "10.1.2.3", TOKEN) == 200
    assert _status(client, "10.1.2.3") == 401
    assert _status(client, "10.9.9.9", TOKEN) == 403


def test_forwarded_for_counts_only_when_trusted_and_only_the_proxys_entry(client: Client, settings: Any) -> None:
    spoofed = {"HTTP_X_FORWARDED_FOR": "127.0.0.1"}
    assert _status(client, "10.0.0.5", **spoofed) == 403
    settings.TRUST_X_FORWARDED_FOR = True
    assert _status(client, "10.0.0.9", HTTP_X_FORWARDED_FOR="127.0.0.1, 203.0.113.7") == 403
    assert _status(client, "10.0.0.9", HTTP_X_FORWARDED_FOR="203.0.113.7, 127.0.0.1") == 200


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"METRICS_TOKEN": "short"}, "METRICS_TOKEN must be at least 24 characters long."),
        ({"METRICS_ALLOWED_NETWORKS": "10.0.0.0/8,intranet"}, "METRICS_ALLOWED_NETWORKS has 'intranet', which is not"),
        (
            {"METRICS_ALLOWED_NETWORKS": "10.0.0.0/8,,::1"},
            "METRICS_ALLOWED_NETWORKS='10.0.0.0/8,,::1' has an empty item",
        ),
    ],
)
def test_malformed_settings_stop_start_up(tmp_path: Path, variables: dict[str, str], message: str) -> None:
    environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")}
    environ.update(DJANGO_SETTINGS_MODULE="gpucloud.settings", GPUCLOUD_DATA_DIR=str(tmp_path), **variables)
    code = "from django.conf import settings; print(settings.METRICS_ALLOWED_NETWORKS)"
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60
    )
    assert run.returncode != 0 and "ImproperlyConfigured" in run.stderr and message in run.stderr
    environ.update(METRICS_TOKEN="t" * 24, METRICS_ALLOWED_NETWORKS="10.0.0.0/8, 192.0.2.7, ::1")
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60
    )
    assert run.stdout.strip() == "['10.0.0.0/8', '192.0.2.7', '::1']", run.stderr


def test_only_reads(client: Client) -> None:
    assert client.post("/metrics").status_code == 405


# --- cost --------------------------------------------------------------------------------


def _fleet(world: World, nodes: int, start: int) -> None:
    made = Node.objects.bulk_create(
        Node(name=f"f{i}", pool=world.pool, runtime="simulated", state="ready", last_heartbeat_at=timezone.now())
        for i in range(start, start + nodes)
    )
    now = timezone.now()
    Gpu.objects.bulk_create(
        Gpu(
            node=node, index=g, uuid=f"GPU-{node.name}-{g}", model="NVIDIA A100-SXM4-40GB", utilization=50.0,
            memory_used_mib=10, last_sample=_sample(f"GPU-{node.name}-{g}", g), last_sample_at=now,
        )
        for node in made
        for g in range(4)
    )  # fmt: skip


def _queries(client: Client) -> int:
    with CaptureQueriesContext(connection) as queries:
        _scrape(client)
    return len(queries)


def test_a_scrape_costs_a_fixed_number_of_queries(world: World, client: Client) -> None:
    _seed(world)
    _fleet(world, 5, 0)
    small = _queries(client)
    _fleet(world, 40, 5)
    running = services.submit_workload(
        actor=Actor(user=world.member_a), project=world.project_a, data=request(world, name="more", gpus_per_replica=4)
    )
    run_pass_now()
    assert Allocation.all_tenants.filter(workload=running).count() == 4
    # GPU readings, holders, GPU counts, pools and nodes, pools and workloads.
    assert _queries(client) == small == 7


# --- the example Grafana dashboard --------------------------------------------------------

PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool", "inf",
    "nan",
}  # fmt: skip


def _metric_names(expr: str) -> set[str]:
    """Return the metric names a PromQL expression reads: identifiers that are no function, keyword or label."""
    text = re.sub(r'"(?:\\.|[^"\\])*"', "", expr)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)  # label lists
    text = re.sub(r"\$\{?\w+\}?", "", text)  # Grafana variables ($__rate_interval, ${pool})
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        after = text[match.end() :].lstrip()
        if after.startswith("(") or match.group(0) in PROMQL_WORDS:
            continue
        names.add(match.group(0))
    return names


def _expressions(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        query = node.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if isinstance(query, str) and "label_values(" in query:
            found.append(re.sub(r"label_values\(\s*([A-Za-z_:][\w:]*)(?:\{[^}]*\})?\s*,[^)]*\)", r"\1", query))
        return found + [e for value in node.values() for e in _expressions(value)]
    if isinstance(node, list):
        return [e for value in node for e in _expressions(value)]
    return []


def test_metric_names_are_read_from_promql() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le) (rate(gpucloud_scheduling_pass_duration_seconds_bucket{pool="$pool"}'
        "[$__rate_interval]))) / on (pool) group_left max without (x) (gpucloud_gpus)"
    )
    assert _metric_names(expr) == {"gpucloud_scheduling_pass_duration_seconds_bucket", "gpucloud_gpus"}


def test_every_metric_the_dashboard_queries_is_exported(world: World, client: Client) -> None:
    _seed(world)
    record_pass_duration(0.01)
    exported = {sample.name for family in _scrape(client).values() for sample in family.samples}
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = _expressions(dashboard)
    assert len(expressions) >= 10
    queried = set().union(*(_metric_names(expr) for expr in expressions))
    assert {"DCGM_FI_DEV_GPU_UTIL", "gpucloud_scheduling_pass_duration_seconds_bucket"} <= queried
    assert queried - exported == set()


def test_queued_tasks_per_queue(client: Client) -> None:
    """Waiting messages per queue, read from the broker: a coalesced control request counts once."""
    from common import control
    from gpucloud.celery import app
    from tests.workers import purge

    purge(["control", "ingest"])
    control._release(Reconcile.TASK)
    for _ in range(5):
        control.request(Reconcile.TASK)
    app.send_task(LogBatches.TASK, kwargs={"batches": []}, queue=control.INGEST_QUEUE)
    try:
        queued = {s.labels["queue"]: s.value for s in _scrape(client)["gpucloud_queued_tasks"].samples}
        assert queued == {"control": 1, "ingest": 1}
    finally:
        purge(["control", "ingest"])
        control._release(Reconcile.TASK)
