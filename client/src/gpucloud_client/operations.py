"""The API's operations as `Call`s: one function per endpoint, shared by the sync and async clients.

Each returns the request (path under `/api/v1/`, query, body, headers) and how to read its answer into a
model. Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from gpucloud_client.errors import EXIT_USAGE, ClientError
from gpucloud_client.models import ApiObject, LogPage, Me, Quota, QuotaUse, Volume, Workload, WorkloadDetail
from gpucloud_client.transport import Call, new_idempotency_key

M = TypeVar("M", bound=ApiObject)

PAGE_SIZE = 500  # the API's largest page: fewest requests for a whole list
MAX_LOG_PAGE = 5000
ACTIONS = frozenset({"cancel", "restart", "extend", "hibernate", "resume"})


@dataclass
class Page(Generic[M]):
    """One page of a paginated list; `has_next` says whether another page follows."""

    results: list[M] = field(default_factory=list)
    count: int = 0
    has_next: bool = False


def tenant_path(tenant: str | None, rest: str) -> str:
    """Return `tenants/<tenant>/<rest>`; raises ClientError when no tenant is known."""
    if not tenant:
        raise ClientError(
            "no tenant: pass --tenant, set GPUCLOUD_TENANT, or log in with a tenant's token", exit_code=EXIT_USAGE
        )
    return f"tenants/{quote(tenant, safe='')}/{rest}"


def _parse_page(model: type[M]) -> Any:
    def parse(data: Any) -> Page[M]:
        rows = data.get("results", []) if isinstance(data, dict) else []
        results = [model.from_json(row) for row in rows if isinstance(row, dict)]
        count = data.get("count", len(results)) if isinstance(data, dict) else len(results)
        return Page(results, int(count or 0), bool(isinstance(data, dict) and data.get("next")))

    return parse


def _object(model: type[M]) -> Any:
    return lambda data: model.from_json(data if isinstance(data, dict) else {})


def _nothing(data: Any) -> None:
    return None


def _budget_notes(data: Any) -> list[str]:
    notes = data.get("budget_notes") if isinstance(data, dict) else None
    return [str(note) for note in notes] if isinstance(notes, list) else []


def me() -> Call[Me]:
    """`GET me/`: the caller, the token in use, and memberships."""
    return Call("GET", "me/", _object(Me))


def workloads_page(tenant: str | None, filters: dict[str, str | None], page: int) -> Call[Page[Workload]]:
    """`GET tenants/<t>/workloads/`: page `page` of the workloads matching `filters` (None values left out)."""
    params = {key: value for key, value in filters.items() if value is not None}
    params.update(page=str(page), page_size=str(PAGE_SIZE))
    return Call("GET", tenant_path(tenant, "workloads/"), _parse_page(Workload), params=params)


def workload(tenant: str | None, workload_id: int) -> Call[WorkloadDetail]:
    """`GET tenants/<t>/workloads/<id>/`: one workload with allocations, events and launch steps."""
    return Call("GET", tenant_path(tenant, f"workloads/{int(workload_id)}/"), _object(WorkloadDetail))


def with_project(body: dict[str, Any], project: str | None) -> dict[str, Any]:
    """Return the submission `body` with `project` filled in from the context when it names none."""
    if "project" in body or project is None:
        return body
    return {"project": project, **body}


def validate(tenant: str | None, body: dict[str, Any]) -> Call[list[str]]:
    """`POST tenants/<t>/workloads/validate/`: the API's verdict on a submission and what the budgets over its
    project say of it (`budget_notes`); writes nothing."""
    return Call("POST", tenant_path(tenant, "workloads/validate/"), _budget_notes, body=body)


def validate_bulk(tenant: str | None, project: str, items: list[dict[str, Any]]) -> Call[list[str]]:
    """`POST tenants/<t>/workloads/bulk/validate/`: the API's verdict on a bulk submission, with its budget notes."""
    body = {"project": project, "items": items}
    return Call("POST", tenant_path(tenant, "workloads/bulk/validate/"), _budget_notes, body=body)


def submit(tenant: str | None, body: dict[str, Any], idempotency_key: str | None = None) -> Call[Workload]:
    """`POST tenants/<t>/workloads/` with an Idempotency-Key (a new one when None): safe to retry."""
    headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
    return Call("POST", tenant_path(tenant, "workloads/"), _object(Workload), body=body, headers=headers)


def submit_bulk(
    tenant: str | None, project: str, items: list[dict[str, Any]], idempotency_key: str | None = None
) -> Call[list[Workload]]:
    """`POST tenants/<t>/workloads/bulk/`: all the items into `project`, all or nothing."""
    headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
    body = {"project": project, "items": items}

    def parse(data: Any) -> list[Workload]:
        rows = data.get("results", []) if isinstance(data, dict) else []
        return [Workload.from_json(row) for row in rows if isinstance(row, dict)]

    return Call("POST", tenant_path(tenant, "workloads/bulk/"), parse, body=body, headers=headers)


def action(tenant: str | None, workload_id: int, name: str) -> Call[Workload]:
    """`POST tenants/<t>/workloads/<id>/<name>/` for cancel, restart, extend, hibernate or resume.

    Retrying is safe: each action either is idempotent or answers 409, which is not retried.
    """
    if name not in ACTIONS:
        raise ValueError(f"unknown workload action {name!r}")
    path = tenant_path(tenant, f"workloads/{int(workload_id)}/{name}/")
    return Call("POST", path, _object(Workload), body={})


def logs(tenant: str | None, workload_id: int, since: int | None = None, limit: int = 1000) -> Call[LogPage]:
    """`GET tenants/<t>/workloads/<id>/logs/`: the last `limit` lines, or those after `since`."""
    params = {"limit": str(max(1, min(limit, MAX_LOG_PAGE)))}
    if since is not None:
        params["since"] = str(since)
    return Call("GET", tenant_path(tenant, f"workloads/{int(workload_id)}/logs/"), _object(LogPage), params=params)


def usage(tenant: str | None) -> Call[list[QuotaUse]]:
    """`GET tenants/<t>/usage/`: GPUs in use against the tenant's and its projects' quotas."""

    def parse(data: Any) -> list[QuotaUse]:
        rows = data.get("quotas", []) if isinstance(data, dict) else []
        return [QuotaUse.from_json(row) for row in rows if isinstance(row, dict)]

    return Call("GET", tenant_path(tenant, "usage/"), parse)


def quotas_page(tenant: str | None, page: int) -> Call[Page[Quota]]:
    """`GET tenants/<t>/quotas/`: the tenant's quota per pool."""
    params = {"page": str(page), "page_size": str(PAGE_SIZE)}
    return Call("GET", tenant_path(tenant, "quotas/"), _parse_page(Quota), params=params)


def project_quotas_page(tenant: str | None, page: int) -> Call[Page[Quota]]:
    """`GET tenants/<t>/project-quotas/`: the projects' quotas inside the tenant's."""
    params = {"page": str(page), "page_size": str(PAGE_SIZE)}
    return Call("GET", tenant_path(tenant, "project-quotas/"), _parse_page(Quota), params=params)


def volumes_page(tenant: str | None, page: int) -> Call[Page[Volume]]:
    """`GET tenants/<t>/volumes/`: the volumes the caller can see."""
    params = {"page": str(page), "page_size": str(PAGE_SIZE)}
    return Call("GET", tenant_path(tenant, "volumes/"), _parse_page(Volume), params=params)
