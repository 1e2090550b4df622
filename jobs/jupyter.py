"""What a notebook session's Jupyter server says about its own activity.

The idle reclaim (`jobs.services.idle`) asks each running notebook's Jupyter
server, with the session's token, whether anything happened lately. It
depends only on the `ActivitySource` protocol, so tests can drive it with
fakes that are slow, unreachable or busy; `JupyterClient` is the real one
(jupyter_server's REST API: `/api/status` and `/api/kernels`).
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

# Seconds one request to a notebook's Jupyter server may take: the check visits every running
# notebook, so a hung server must not hold up the others for long.
REQUEST_TIMEOUT_SECONDS = 3.0


class JupyterUnavailable(Exception):
    """The Jupyter server did not answer, refused the token, or answered something unreadable."""


@dataclass(frozen=True)
class JupyterActivity:
    """Jupyter's own view: when it last saw activity (API, kernels, terminals), and its kernels' states."""

    last_activity: datetime | None
    kernels: int
    busy_kernels: int
    connections: int
    # The file of the most recently active session (relative to Jupyter's root), where Resume brings its
    # owner back; None when no session is open.
    last_path: str | None = None


class ActivitySource(Protocol):
    def activity(self, *, endpoint: str, workload_id: int, token: str) -> JupyterActivity:
        """Return the activity of the notebook served at `endpoint`; raises JupyterUnavailable."""
        ...


def parse_time(value: Any) -> datetime | None:
    """Return Jupyter's ISO 8601 timestamp as an aware datetime (UTC when it names no zone), or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def last_session_path(sessions: list[dict[str, Any]]) -> str | None:
    """Return the path of the session whose kernel was active last (`/api/sessions`), or None."""
    best: tuple[datetime, str] | None = None
    for session in sessions:
        path = session.get("path")
        kernel = session.get("kernel")
        kernel = kernel if isinstance(kernel, dict) else {}
        stamp = parse_time(kernel.get("last_activity")) or datetime.min.replace(tzinfo=UTC)
        if isinstance(path, str) and path and (best is None or stamp >= best[0]):
            best = (stamp, path)
    return best[1] if best else None


def workspace_current_path(workspace: Any) -> str | None:
    """Return the path of the document JupyterLab shows in front (its saved `default` workspace), or None.

    JupyterLab saves its layout in the workspace: `layout-restorer:data`
    names the current main-area widget (`editor:notes.txt`,
    `notebook:train.ipynb`), whose own entry holds the document's path. This
    covers any document, where sessions know only notebooks and consoles.
    """
    data = workspace.get("data") if isinstance(workspace, dict) else None
    if not isinstance(data, dict):
        return None
    layout = data.get("layout-restorer:data")
    main = layout.get("main") if isinstance(layout, dict) else None
    current = main.get("current") if isinstance(main, dict) else None
    widget = data.get(current) if isinstance(current, str) else None
    state = widget.get("data") if isinstance(widget, dict) else None
    path = state.get("path") if isinstance(state, dict) else None
    return path if isinstance(path, str) and path else None


def _last_path(workspace: Any, sessions: list[dict[str, Any]]) -> str | None:
    """Return the document in front: the workspace's, unless it is a notebook or console, which have sessions.

    JupyterLab saves its workspace when its layout changes, not when a
    document is renamed: for a notebook, the live session has its current name.
    """
    in_front = workspace_current_path(workspace)
    session = last_session_path(sessions)
    if in_front is None or (session is not None and _widget_kind(workspace) in ("notebook", "console")):
        return session
    return in_front


def _widget_kind(workspace: Any) -> str:
    """Return the kind of JupyterLab's current main-area widget (`editor`, `notebook`, ...), or ""."""
    try:
        current = workspace["data"]["layout-restorer:data"]["main"]["current"]
    except (KeyError, TypeError):
        return ""
    return current.split(":", 1)[0] if isinstance(current, str) else ""


def activity_from(
    status: dict[str, Any],
    kernels: list[dict[str, Any]],
    sessions: list[dict[str, Any]] | None = None,
    workspace: Any = None,
) -> JupyterActivity:
    """Return the activity that `/api/status`, `/api/kernels` (and `/api/sessions`, the workspace) describe.

    The last path is the document in front (`_last_path`).
    """
    stamps = [parse_time(status.get("last_activity"))] + [parse_time(k.get("last_activity")) for k in kernels]
    known = [stamp for stamp in stamps if stamp is not None]
    return JupyterActivity(
        last_activity=max(known) if known else None,
        kernels=len(kernels),
        busy_kernels=sum(1 for kernel in kernels if kernel.get("execution_state") == "busy"),
        connections=int(status.get("connections") or 0),
        last_path=_last_path(workspace, sessions or []),
    )


class JupyterClient:
    """Reads a notebook's activity over HTTP from its Jupyter server (base URL `/notebooks/<id>/`)."""

    def __init__(self, *, timeout: float = REQUEST_TIMEOUT_SECONDS) -> None:
        self.timeout = timeout

    def activity(self, *, endpoint: str, workload_id: int, token: str) -> JupyterActivity:
        """Return the notebook's activity; raises JupyterUnavailable when the server does not answer properly."""
        base = f"{endpoint.rstrip('/')}/notebooks/{workload_id}/api"
        status = self._get(f"{base}/status", token)
        # Our own polling must not count as the user's activity: Jupyter honours this flag.
        kernels = self._get(f"{base}/kernels?no_track_activity=1", token)
        sessions = self._get(f"{base}/sessions?no_track_activity=1", token)
        if not isinstance(status, dict) or not isinstance(kernels, list) or not isinstance(sessions, list):
            raise JupyterUnavailable("unexpected answer shape from the Jupyter API")
        return activity_from(
            status,
            [k for k in kernels if isinstance(k, dict)],
            [s for s in sessions if isinstance(s, dict)],
            self._workspace(endpoint, workload_id, token),
        )

    def _workspace(self, endpoint: str, workload_id: int, token: str) -> Any:
        """Return JupyterLab's saved `default` workspace, or None (a plain Jupyter server has none)."""
        url = f"{endpoint.rstrip('/')}/notebooks/{workload_id}/lab/api/workspaces/default?no_track_activity=1"
        try:
            return self._get(url, token)
        except JupyterUnavailable:
            return None

    def _get(self, url: str, token: str) -> Any:
        if not url.startswith(("http://", "https://")):
            raise JupyterUnavailable(f"not an http(s) endpoint: {url}")
        request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})  # noqa: S310 -- scheme checked above
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 -- scheme checked above
                return json.loads(response.read(1_000_000))
        except (OSError, ValueError) as error:  # URLError, HTTPError and timeouts are OSErrors
            raise JupyterUnavailable(f"{url}: {error}") from error
