"""The Jupyter client against a real Jupyter server: which document its owner had in front.

The server runs through the process runtime as a notebook's does (the
`jupyter` fixture of tests/jobs/test_proxy.py); JupyterLab's saved workspace
is written the way its frontend writes it.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from jobs.jupyter import JupyterClient, workspace_current_path
from tests.jobs.test_proxy import JUPYTER_ID, SECRET, jupyter  # noqa: F401 -- the real Jupyter server, as a fixture


def _layout(current: str, path: str) -> dict[str, Any]:
    return {
        "data": {
            "layout-restorer:data": {"main": {"dock": {"widgets": [current]}, "current": current}},
            current: {"data": {"path": path, "factory": "Editor"}},
        },
        "metadata": {"id": "default"},
    }


def test_the_document_in_front_of_jupyterlab_is_the_last_path_whatever_its_kind(jupyter: str) -> None:  # noqa: F811
    client = JupyterClient(timeout=5)
    url = f"{jupyter}/notebooks/{JUPYTER_ID}/lab/api/workspaces/default"
    headers = {"Authorization": f"token {SECRET}"}
    assert httpx.put(url, json=_layout("editor:src/train.py", "src/train.py"), headers=headers).status_code == 204
    activity = client.activity(endpoint=jupyter, workload_id=JUPYTER_ID, token=SECRET)
    assert activity.last_path == "src/train.py", "a plain file has no session: only the workspace knows it"
    assert httpx.put(url, json=_layout("notebook:a b.ipynb", "a b.ipynb"), headers=headers).status_code == 204
    assert client.activity(endpoint=jupyter, workload_id=JUPYTER_ID, token=SECRET).last_path == "a b.ipynb"


def test_for_a_notebook_in_front_the_live_session_has_its_current_name() -> None:
    from jobs.jupyter import activity_from

    stale = _layout("notebook:Untitled.ipynb", "Untitled.ipynb")  # saved before the notebook was renamed
    sessions = [{"path": "experiment.ipynb", "kernel": {"last_activity": "2026-11-25T10:00:00Z"}}]
    assert activity_from({}, [], sessions, stale).last_path == "experiment.ipynb"
    assert activity_from({}, [], [], stale).last_path == "Untitled.ipynb"
    assert activity_from({}, [], sessions, _layout("editor:notes.txt", "notes.txt")).last_path == "notes.txt"


@pytest.mark.parametrize(
    "workspace",
    [
        None,
        {},
        {"data": []},
        {"data": {"layout-restorer:data": {"main": {"current": "editor:x"}}}},
        {"data": {"layout-restorer:data": {"main": {"current": 3}}}},
        {"data": {"layout-restorer:data": {"main": {"current": "editor:x"}}, "editor:x": {"data": {"path": ""}}}},
    ],
)
def test_a_workspace_without_a_document_in_front_names_none(workspace: Any) -> None:
    assert workspace_current_path(workspace) is None
