"""The switches of the fast paths: second implementations of what Django or DRF already do, each one off-able.

A fast path exists because a benchmark showed the framework's own path too
slow for one measure (docs/fastpaths.md lists them, with the figures). Each
has a name here and a switch in `settings.FAST_PATHS`, which the
deployment sets from `GPUCLOUD_FAST_PATHS_OFF` (comma-separated names, or
`all`); with its switch off, the framework's own path serves instead, with
the same answers (the parity tests run both ways).

- `submission_ingest`: `jobs.api.fast_ingest`, the ASGI middleware committing
  API submissions together in front of DRF; off, DRF's view serves them.
- `bulk_instances`: `common.fast_bulk`, new instances through `Model.__new__`
  and inserts as one JSON parameter; off, `Model(**values)` and
  `bulk_create`.
- `token_sql`: `tenants.fast_sql.tokens_with_role`, the API token lookup as one
  hand-written statement; off, the ORM queryset it is held to.
- `proxy_client`: `jobs.fast_upstream`, the notebook proxy's own HTTP/1.1
  client over h11; off, httpx (`jobs.upstream_httpx`).
- `jobs_sql`: `jobs.fast_sql`, the submission path's reads and event insert,
  the scheduler's reasons and plans, the log chain's one statement; off,
  each function's ORM form beside it (the log chain: `jobs.services.logs.chain`'s).
- `telemetry_sql`: `inventory.fast_sql`, the telemetry writes of agents'
  reports (latest samples, rollup minutes, replay marks); off, each
  function's ORM form beside it.

Every fast-path module is named `fast_*.py`, so a reader knows from the name
that the framework's own path exists too.
"""

from __future__ import annotations

from django.conf import settings

SUBMISSION_INGEST = "submission_ingest"
BULK_INSTANCES = "bulk_instances"
TOKEN_SQL = "token_sql"  # noqa: S105 -- a switch's name, not a secret
PROXY_CLIENT = "proxy_client"
JOBS_SQL = "jobs_sql"
TELEMETRY_SQL = "telemetry_sql"
NAMES = (SUBMISSION_INGEST, BULK_INSTANCES, TOKEN_SQL, PROXY_CLIENT, JOBS_SQL, TELEMETRY_SQL)
"""Every fast path's name, as `GPUCLOUD_FAST_PATHS_OFF` and `settings.FAST_PATHS` spell it."""
ALL = "all"


def switches(off: list[str]) -> dict[str, bool]:
    """Return each fast path's switch (True: on) with the names in `off` (or `all`) off.

    Raises ValueError naming an unknown name: a typo must not leave a path on.
    """
    unknown = sorted(set(off) - {*NAMES, ALL})
    if unknown:
        raise ValueError(f"unknown fast path {', '.join(unknown)}; the names are {', '.join((*NAMES, ALL))}")
    return {name: ALL not in off and name not in off for name in NAMES}


def enabled(name: str) -> bool:
    """Return whether the fast path `name` serves now (read per call, so tests may switch it)."""
    return bool(settings.FAST_PATHS[name])
