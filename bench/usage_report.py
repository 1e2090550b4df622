"""Usage reports at scale: a year of a 100-tenant, 1,000-user, 8,000-GPU cloud, rolled up by hour, on Postgres.

    DATABASE_URL=postgres://gpucloud:gpucloud@127.0.0.1:5432/gpucloud \\
        .venv/bin/python bench/usage_report.py [--scale 1] [--runs 20] [--sampled-gpus 64] [--keep]

DATABASE_URL names the Postgres server and a role that may create databases:
the bench works in a database of its own (`--database`, default
gpucloud_bench, created afresh and dropped at the end unless `--keep`). It
migrates it and writes the ledger directly (COPY), as the scheduler and the
agents would have left it:

- `--scale` x 100 tenants of very different sizes (Zipf-like shares), each with
  10 users and 3 projects; `--scale` x 1,000 nodes of 8 GPUs (H100, A100 and
  L40S pools), each node cut into blocks of 1, 2, 4 or 8 GPUs;
- on every block, for a year up to now, jobs one after another: log-normal
  lengths around 8 hours (10 minutes to 6 days), gaps around 5 hours, 6 % of
  them preempted once and run again, the last ones still running; a job's
  CPU and memory shared over its GPUs;
- per-minute GPU samples for `--sampled-gpus` GPUs over the measured month
  (every minute, held or not: an agent samples every GPU), not the whole
  fleet's: a year of 8,000 GPUs' minutes would be 4 billion rows;
- prices per GPU model, CPU and memory, changed once in the year and once
  inside the measured month at a time that is not on the hour.

Then it rolls the year up by hour (accounting.services.rollups, timed) and reports, as
JSON: the tenant month report (last month, by project and user) through the
selector, with and without the rollups, for the largest and a median tenant
(p50/p95 over `--runs`); the usage page rendering it (/t/<tenant>/usage/,
Django's handler in this process, as a tenant admin); the CSV export of a
365-day period by user for every tenant (operators' export) through the
selector and the page; and the consistency check: the same reports from the
ledger alone and through the rollups, their largest differences.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")

POOLS: tuple[tuple[str, str, float], ...] = (
    ("bench-h100", "NVIDIA H100 80GB HBM3", 0.5),
    ("bench-a100", "NVIDIA A100-SXM4-80GB", 0.3),
    ("bench-l40s", "NVIDIA L40S", 0.2),
)
BLOCKS = ((8,), (4, 4), (4, 2, 2), (2, 2, 2, 2), (2, 2, 4), (1, 1, 2, 4), (1,) * 8)
USERS_PER_TENANT, PROJECTS_PER_TENANT = 10, 3
HOUR = 3600.0


@dataclass
class People:
    """Who runs work: per person (tenant index, tenant id, user id, project ids) and how much of it."""

    tenants: list[Any] = field(default_factory=list)
    persons: list[tuple[int, int, int, list[int]]] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    admins: dict[int, Any] = field(default_factory=dict)  # tenant id -> a tenant admin


# --- the scratch database ------------------------------------------------------------------------------


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _admin(url: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(statement)


@contextmanager
def _scratch(url: str, name: str, *, keep: bool, fresh: bool) -> Iterator[None]:
    """Point DATABASE_URL at the database `name` on `url`'s server, created afresh when `fresh`; drop it after
    unless `keep`."""
    if not url.startswith("postgres"):
        raise SystemExit("Set DATABASE_URL to a Postgres server (a role that may create databases).")
    if fresh:
        _admin(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        _admin(url, f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = _with_database(url, name)
    try:
        yield
    finally:
        from django.db import connections

        connections.close_all()
        if keep:
            print(f"kept database {name}", file=sys.stderr)
        else:
            _admin(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- COPY --------------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    """`value` as a field of COPY's text format."""
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, dict | list):
        value = json.dumps(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value).replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _copy(model: Any, varying: list[str], rows: Iterable[tuple[Any, ...]]) -> int:
    """COPY `rows` (values of the `varying` attributes, in order) into `model`'s table, every other column at
    its model default (the id the database's, unless given); return how many rows were written."""
    from django.db import connection

    template = model()
    fields = model._meta.concrete_fields
    constant = [f for f in fields if f.attname not in varying and f is not model._meta.auto_field]
    missing = [f.attname for f in constant if getattr(template, f.attname) is None and not f.null]
    if missing:
        raise SystemExit(f"{model.__name__}: give {missing}")
    columns = [model._meta.get_field(name).column for name in varying] + [f.column for f in constant]
    tail = "".join("\t" + _text(getattr(template, f.attname)) for f in constant) + "\n"
    written = 0
    names = ", ".join(f'"{column}"' for column in columns)
    with connection.cursor() as cursor, cursor.copy(f'COPY "{model._meta.db_table}" ({names}) FROM STDIN') as copy:
        buffer: list[str] = []
        for row in rows:
            buffer.append("\t".join(map(_text, row)) + tail)
            written += 1
            if len(buffer) >= 10_000:
                copy.write("".join(buffer))
                buffer.clear()
        copy.write("".join(buffer))
    with connection.cursor() as cursor:
        table = model._meta.db_table
        last = f'SELECT coalesce(max(id), 1) FROM "{table}"'  # noqa: S608 -- a model's own table name, not input
        cursor.execute(f"SELECT setval(pg_get_serial_sequence(%s, 'id'), ({last}))", [table])
    return written


# --- the world ---------------------------------------------------------------------------------------


def _people(rng: random.Random, tenants: int) -> People:
    from django.contrib.auth.models import User

    from tenants.models import Membership, Project, Tenant

    people = People()
    made = Tenant.objects.bulk_create(Tenant(slug=f"t{i:03d}", name=f"Tenant {i}") for i in range(tenants))
    users = User.objects.bulk_create(
        User(username=f"u{i:04d}", password="!")
        for i in range(tenants * USERS_PER_TENANT)  # an unusable password
    )
    projects = Project.all_tenants.bulk_create(
        Project(tenant=tenant, slug=f"p{p}", name=f"Project {p}") for tenant in made for p in range(PROJECTS_PER_TENANT)
    )
    memberships = []
    for t, tenant in enumerate(made):
        share = 1 / (t + 1) ** 0.9  # a few large tenants, a long tail of small ones
        own = projects[t * PROJECTS_PER_TENANT : (t + 1) * PROJECTS_PER_TENANT]
        for u in range(USERS_PER_TENANT):
            user = users[t * USERS_PER_TENANT + u]
            memberships.append(Membership(tenant=tenant, user=user, role="admin" if u == 0 else "member"))
            mine = [own[u % len(own)].pk] + ([own[(u + 1) % len(own)].pk] if rng.random() < 0.3 else [])
            people.persons.append((t, tenant.pk, user.pk, mine))
            people.weights.append(share / (u + 1) ** 0.7)
        people.admins[tenant.pk] = users[t * USERS_PER_TENANT]
    Membership.all_tenants.bulk_create(memberships)
    people.tenants = made
    return people


def _fleet(nodes: int) -> list[tuple[Any, str, list[int]]]:
    """Create the pools, `nodes` nodes of 8 GPUs; return (node, model, GPU ids) per node."""
    from inventory.models import Gpu, Node, NodePool

    fleet = []
    start = 0
    for name, model, share in POOLS:
        pool = NodePool.objects.create(name=name)
        count = round(nodes * share) if name != POOLS[-1][0] else nodes - start
        made = Node.objects.bulk_create(
            Node(name=f"{name}-{i:05d}", pool=pool, runtime="simulated", state="ready", cpu_cores=128)
            for i in range(count)
        )
        gpus = Gpu.objects.bulk_create(
            Gpu(node=node, index=g, uuid=f"GPU-{node.name}-{g}", model=model) for node in made for g in range(8)
        )
        for n, node in enumerate(made):
            fleet.append((node, model, [gpu.pk for gpu in gpus[n * 8 : (n + 1) * 8]]))
        start += count
    return fleet


@dataclass
class Ledger:
    workloads: list[tuple[Any, ...]] = field(default_factory=list)
    allocations: list[tuple[Any, ...]] = field(default_factory=list)
    held: dict[int, list[tuple[float, float, float]]] = field(default_factory=dict)  # sampled GPU -> (from, to, util)


def _ledger(
    rng: random.Random, people: People, fleet: list[Any], start: float, now: float, sampled: set[int]
) -> Ledger:
    """Every block's year of jobs, as COPY rows of workloads and allocations; the sampled GPUs' held stretches."""
    ledger = Ledger()
    cumulative = list(_accumulate(people.weights))
    workload_id = allocation_id = 0
    for node, _, gpu_ids in fleet:
        blocks = rng.choice(BLOCKS)
        offset = 0
        for size in blocks:
            block = gpu_ids[offset : offset + size]
            offset += size
            moment = start - rng.uniform(0, 3 * 86400)
            while True:
                moment += rng.expovariate(1 / (5 * HOUR))
                if moment >= now:
                    break
                length = min(max(rng.lognormvariate(math.log(8 * HOUR), 1.1), 600.0), 6 * 86400.0)
                _, tenant_id, owner_id, projects = rng.choices(people.persons, cum_weights=cumulative)[0]
                workload_id += 1
                busy = rng.choice((1.0, 2.0, 40.0, 70.0, 85.0, 95.0))
                attempts = [(moment, moment + length)]
                if rng.random() < 0.06:  # preempted once, run again after a pause
                    cut = moment + length * rng.uniform(0.1, 0.9)
                    again = cut + rng.uniform(60, 1800)
                    attempts = [(moment, cut), (again, again + (moment + length - cut))]
                    attempts = attempts[:1] if cut >= now or again >= now else attempts  # one runs until now
                for begin, end in attempts:
                    released = None if end >= now else _at(end)
                    for gpu_id in block:
                        allocation_id += 1
                        ledger.allocations.append(
                            (allocation_id, tenant_id, workload_id, 0, node.pk, gpu_id, _at(begin), released)
                        )
                        if gpu_id in sampled:
                            ledger.held.setdefault(gpu_id, []).append((begin, min(end, now), busy))
                finished = attempts[-1][1]
                state = "running" if finished >= now else "succeeded"
                ledger.workloads.append(
                    (
                        workload_id,
                        tenant_id,
                        rng.choice(projects),
                        owner_id,
                        node.pool_id,
                        f"job-{workload_id}",
                        size,
                        size * rng.choice((4000, 8000, 16000)),
                        size * rng.choice((32768, 65536, 131072)),
                        state,
                        _at(moment - rng.uniform(0, 600)),
                        _at(moment),
                        None if state == "running" else _at(finished),
                        _at(moment),
                        _at(min(finished, now)),
                    )
                )
                if finished >= now:
                    break
                moment = finished
    return ledger


def _accumulate(values: list[float]) -> Iterator[float]:
    total = 0.0
    for value in values:
        total += value
        yield total


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _write_ledger(ledger: Ledger) -> tuple[int, int]:
    from jobs.models import Allocation, Workload

    workload_fields = ["id", "tenant_id", "project_id", "owner_id", "pool_id", "name", "gpus_per_replica"]
    workload_fields += ["cpu_milli", "memory_mib", "state", "submitted_at", "started_at", "finished_at"]
    workload_fields += ["created_at", "updated_at"]
    workloads = _copy(Workload, workload_fields, ledger.workloads)
    allocation_fields = ["id", "tenant_id", "workload_id", "replica", "node_id", "gpu_id", "created_at", "released_at"]
    return workloads, _copy(Allocation, allocation_fields, ledger.allocations)


def _minutes(rng: random.Random, ledger: Ledger, sampled: set[int], start: datetime, end: datetime) -> int:
    """Every minute of [start, end) of the sampled GPUs: busy as their job, near 0 % when not held."""
    from inventory.models import GpuMinute

    def rows() -> Iterator[tuple[Any, ...]]:
        first = int(start.timestamp()) // 60
        for gpu_id in sorted(sampled):
            stretches = sorted(ledger.held.get(gpu_id, []))
            at = 0
            for minute in range(first, int(end.timestamp()) // 60):
                middle = minute * 60 + 30
                while at < len(stretches) and stretches[at][1] <= middle:
                    at += 1
                busy = stretches[at][2] if at < len(stretches) and stretches[at][0] <= middle else 0.0
                value = min(100.0, max(0.0, busy + rng.uniform(-3, 3)))
                yield gpu_id, _at(minute * 60), 60, value * 60, min(100.0, value + 2)

    return _copy(GpuMinute, ["gpu_id", "minute", "samples", "utilization_sum", "utilization_max"], rows())


def _prices(year_start: datetime, month_start: datetime) -> list[datetime]:
    """Prices per model, CPU and memory, changed mid-year and inside the measured month; return the changes."""
    from decimal import Decimal

    from accounting.models import Price

    changes = [year_start + timedelta(days=200, hours=3), month_start + timedelta(days=9, hours=14, seconds=1043.417)]
    rows = [("gpu", POOLS[0][1], "2.49", year_start - timedelta(days=30))]
    rows += [("gpu", POOLS[1][1], "1.29", year_start - timedelta(days=30))]
    rows += [("gpu", POOLS[2][1], "0.79", year_start - timedelta(days=30))]
    rows += [("cpu", "", "0.021", year_start - timedelta(days=30)), ("memory", "", "0.0031", year_start)]
    rows += [("gpu", POOLS[1][1], "1.19", changes[0]), ("gpu", POOLS[0][1], "2.29", changes[1])]
    Price.objects.bulk_create(
        Price(resource=resource, gpu_model=model, amount_per_hour=Decimal(amount), effective_from=when)
        for resource, model, amount, when in rows
    )
    return changes


# --- measuring ---------------------------------------------------------------------------------------


def _timed(function: Callable[[], Any], runs: int) -> tuple[dict[str, float], Any]:
    """Run `function` once to warm up, then `runs` times; return p50/p95/max in ms, and the last result."""
    result = function()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        result = function()
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    p95 = times[min(len(times) - 1, math.ceil(len(times) * 0.95) - 1)]
    return {
        "p50_ms": round(statistics.median(times), 1),
        "p95_ms": round(p95, 1),
        "max_ms": round(times[-1], 1),
    }, result


@contextmanager
def _ledger_only() -> Iterator[None]:
    """Read reports from the ledger alone: the rollups' mark removed for the block, then restored."""
    from django.db import transaction

    from accounting.models import RollupMark

    with transaction.atomic():
        RollupMark.objects.all().delete()
        yield
        transaction.set_rollback(True)


def _difference(raw: Any, rolled: Any) -> dict[str, Any]:
    """The largest differences between two reports of the same period: seconds, and cost in cents."""
    from decimal import Decimal

    rows = {row.key: row.usage for row in raw.rows}
    other = {row.key: row.usage for row in rolled.rows}
    pairs = [(rows[key], other[key]) for key in rows if key in other] + [(raw.total, rolled.total)]
    names = ("gpu_seconds", "cpu_seconds", "memory_gib_seconds", "sampled_gpu_seconds", "utilization_minutes")
    seconds = max(abs(getattr(a, name) - getattr(b, name)) for a, b in pairs for name in names)
    relative = max(
        abs(getattr(a, name) - getattr(b, name)) / max(abs(getattr(a, name)), 1.0) for a, b in pairs for name in names
    )
    cents = max(abs(a.cost.quantize(Decimal("0.01")) - b.cost.quantize(Decimal("0.01"))) for a, b in pairs)
    return {
        "same_rows": list(rows) == list(other),
        "rows": len(rows),
        "max_seconds_difference": seconds,
        "max_relative_difference": relative,
        "max_cost_difference": str(cents),
        "gpu_hours": round(raw.total.gpu_hours, 3),
    }


def _page(client: Any, path: str, runs: int) -> tuple[dict[str, float], int]:
    def get() -> int:
        response = client.get(path)
        if response.status_code != 200:
            raise SystemExit(f"{path} answered {response.status_code}")
        return len(b"".join(response.streaming_content) if response.streaming else response.content)

    return _timed(get, runs)


def _resolves(path: str) -> bool:
    from django.urls import Resolver404, resolve

    try:
        resolve(path)
    except Resolver404:
        return False
    return True


def _show(section: str, figures: Any) -> None:
    """Print one section of the results as a line of JSON, as soon as it is measured."""
    print(json.dumps({section: figures}, default=str), flush=True)


def _measure(people: People, month: Any, year: Any, now: datetime, runs: int) -> None:
    from django.contrib.auth.models import User
    from django.test import Client

    from accounting.export import csv_lines
    from accounting.selectors import platform_report, tenant_report

    by = ["project", "user"]
    largest, median = people.tenants[0], people.tenants[len(people.tenants) // 2]  # shares fall with the index
    for label, tenant in (("largest", largest), ("median", median)):
        read = partial(tenant_report, tenant, month, by, now=now)
        rolled_time, rolled = _timed(read, runs)
        with _ledger_only():
            raw_time, raw = _timed(read, max(3, runs // 4))
        consistency = _difference(raw, rolled)
        _show(f"tenant_month_{label}", {"tenant": tenant.slug, "with_rollups": rolled_time, "ledger_only": raw_time})
        _show(f"tenant_month_{label}_consistency", consistency)
    platform_rolled = platform_report(month, ["tenant", "pool"], now=now)
    with _ledger_only():
        platform_raw = platform_report(month, ["tenant", "pool"], now=now)
        platform_again = platform_report(month, ["tenant", "pool"], now=now)
    _show("platform_month_consistency", _difference(platform_raw, platform_rolled))
    # The ledger against itself: what the order of a floating-point SUM alone (parallel workers) moves.
    _show("platform_month_ledger_against_itself", _difference(platform_raw, platform_again))

    def export() -> tuple[int, int]:
        out = io.StringIO()
        writer = csv.writer(out)
        lines = sum(1 for line in csv_lines(platform_report(year, ["user"], now=now)) if writer.writerow(line))
        return lines - 1, len(out.getvalue().encode())

    csv_time, (lines, size) = _timed(export, max(3, runs // 4))
    _show("csv_year_by_user_selector", {**csv_time, "rows": lines, "bytes": size})
    client = Client(SERVER_NAME="127.0.0.1")
    if not _resolves(f"/t/{largest.slug}/usage/"):
        _show("page", f"skipped: /t/{largest.slug}/usage/ does not resolve yet")
        return
    for label, tenant in (("largest", largest), ("median", median)):
        client.force_login(people.admins[tenant.pk])
        for period, query in (("last_month", "?period=last-month&by=project,user"), ("this_month", "")):
            path = f"/t/{tenant.slug}/usage/{query}"
            timing, size = _page(client, path, runs)
            _show(f"page_{period}_{label}", {"path": path, **timing, "bytes": size})
    ops_export = "/ops/usage/export.csv"
    if not _resolves(ops_export):
        _show("csv_year_by_user_page", f"skipped: {ops_export} does not resolve yet")
        return
    operator = User.objects.filter(username="bench-operator").first()
    client.force_login(operator or User.objects.create_superuser("bench-operator", "ops@example.com", None))
    query = f"?period=custom&start={year.start:%Y-%m-%d}&end={year.end:%Y-%m-%d}&by=user"
    timing, size = _page(client, ops_export + query, max(3, runs // 4))
    _show("csv_year_by_user_page", {"path": ops_export + query, **timing, "bytes": size})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="x 100 tenants, 1,000 users, 8,000 GPUs")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--sampled-gpus", type=int, default=64)
    parser.add_argument("--database", default="gpucloud_bench")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--reuse", action="store_true", help="measure a database kept before, as it is")
    parser.add_argument("--seed", type=int, default=19)
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL", "")
    with _scratch(url, args.database, keep=args.keep or args.reuse, fresh=not args.reuse):
        _run(args)


def _run(args: argparse.Namespace) -> None:
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.utils import timezone

    from accounting.periods import Period, month_start, resolve_period

    # Served from the finders, as in development: no collectstatic (and no manifest) for a benchmark.
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    call_command("migrate", verbosity=0)
    now = timezone.now()
    year = Period("custom", month_start(now) - timedelta(days=365), month_start(now))
    month = resolve_period(name="last-month", now=now)
    _show("periods", {"month": [month.start, month.end], "year": [year.start, year.end], "now": now})
    people = _people_kept() if args.reuse else _build(args, year, month, now)
    _measure(people, month, year, now, args.runs)


def _build(args: argparse.Namespace, year: Any, month: Any, now: datetime) -> People:
    """Generate and write the world, roll it up; show what was made and how long it took."""
    from django.db import connection

    from accounting.models import UsageHour
    from accounting.services.rollups import roll_up_hours

    rng = random.Random(args.seed)  # noqa: S311 -- a reproducible world, not a secret
    started = time.perf_counter()
    people = _people(rng, max(2, round(100 * args.scale)))
    fleet = _fleet(max(1, round(1000 * args.scale)))
    all_gpus = [gpu for _, _, gpus in fleet for gpu in gpus]
    sampled = set(rng.sample(all_gpus, min(args.sampled_gpus, len(all_gpus))))
    ledger = _ledger(rng, people, fleet, (year.start - timedelta(days=3)).timestamp(), now.timestamp(), sampled)
    generated = time.perf_counter() - started
    workloads, allocations = _write_ledger(ledger)
    minutes = _minutes(rng, ledger, sampled, month.start, month.end)
    changes = _prices(year.start, month.start)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    world: dict[str, Any] = {"tenants": len(people.tenants), "users": len(people.persons), "gpus": len(all_gpus)}
    world |= {"workloads": workloads, "allocations": allocations, "gpu_minutes": minutes, "sampled_gpus": len(sampled)}
    world |= {"price_changes": changes, "generated_s": round(generated, 1)}
    _show("world", world | {"written_s": round(time.perf_counter() - started - generated, 1)})
    started = time.perf_counter()
    hours = roll_up_hours(since=year.start, until=now, now=now)
    rolled_up = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    _show("rollup", {"hours": hours, "rows": UsageHour.all_tenants.count(), "seconds": round(rolled_up, 1)})
    return people


def _people_kept() -> People:
    """The tenants (largest share first) and their admins of a database kept by an earlier run."""
    from tenants.models import Membership, Tenant

    people = People(tenants=list(Tenant.objects.order_by("pk")))
    for membership in Membership.all_tenants.filter(role="admin").select_related("user"):
        people.admins.setdefault(membership.tenant_id, membership.user)
    return people


if __name__ == "__main__":
    main()
