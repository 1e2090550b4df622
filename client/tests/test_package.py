"""The package: lazy public names, nothing of the server imported, exit codes, models from JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import gpucloud_client
from gpucloud_client import errors
from gpucloud_client.errors import exit_code_for_status, exit_code_for_workload
from gpucloud_client.models import LogLine, Me, WorkloadDetail


def _modules_after(code: str) -> set[str]:
    script = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


def test_importing_the_package_loads_no_heavy_dependency() -> None:
    loaded = _modules_after("import gpucloud_client; from gpucloud_client import Client, AsyncClient, Config")

    assert not {"httpx", "websockets", "yaml", "rich", "click"} & loaded


def test_the_client_never_imports_the_server() -> None:
    code = "from gpucloud_client import client, aclient, spec, streams, config, operations"
    loaded = _modules_after(code)

    server = {"django", "rest_framework", "gpucloud", "common", "tenants", "inventory", "jobs", "frontend"}
    assert not server & {name.split(".")[0] for name in loaded}


def test_every_public_name_resolves() -> None:
    for name in gpucloud_client.__all__:
        assert getattr(gpucloud_client, name) is not None
    assert set(gpucloud_client.__all__) == set(gpucloud_client._EXPORTS)
    with pytest.raises(AttributeError):
        _ = gpucloud_client.NoSuchThing


@pytest.mark.parametrize(
    ("state", "exit_code", "expected"),
    [
        ("succeeded", None, errors.EXIT_OK),
        ("succeeded", 0, 0),
        ("failed", 3, 3),
        ("failed", None, errors.EXIT_FAILED),
        ("failed", -9, errors.EXIT_FAILED),
        ("cancelled", None, errors.EXIT_CANCELLED),
        ("cancelled", 143, errors.EXIT_CANCELLED),
        ("lost", None, errors.EXIT_LOST),
        ("hibernated", None, errors.EXIT_OK),
    ],
)
def test_wait_exit_codes(state: str, exit_code: int | None, expected: int) -> None:
    assert exit_code_for_workload(state, exit_code) == expected


def test_status_exit_codes() -> None:
    codes = [exit_code_for_status(s) for s in (400, 401, 403, 404, 409, 415, 429, 500, 503)]

    assert codes == [3, 4, 4, 5, 6, 3, 7, 7, 7]


def test_models_ignore_unknown_keys_and_keep_the_raw_object() -> None:
    raw = {
        "id": 5,
        "state": "running",
        "future_field": [1],
        "allocations": [{"replica": 0, "node": "n1", "gpu_index": 2, "later": True}],
        "launch_steps": [{"key": "pull", "label": "Pull image", "status": "done"}],
        "notebook_url": "/notebooks/5/lab",
    }

    detail = WorkloadDetail.from_json(raw)
    me = Me.from_json(
        {"username": "ada", "token": {"prefix": "abc", "role": "member"}, "memberships": [{"tenant": "t"}]}
    )

    assert (detail.id, detail.allocations[0].gpu_index, detail.launch_steps[0].status) == (5, 2, "done")
    assert detail.raw is raw and detail.events == [] and not detail.ended and not detail.resting
    assert me.token is not None and me.token.prefix == "abc" and me.memberships[0].tenant == "t"
    assert LogLine.from_row([3, "ts", "stderr", "boom", 2, 1]).raw == {
        "seq": 3,
        "timestamp": "ts",
        "stream": "stderr",
        "text": "boom",
        "attempt": 2,
        "replica": 1,
    }
