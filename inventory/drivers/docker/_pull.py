"""Pulling an image a start found missing: within the start's budget, telling a listener how it goes.

The engine streams one JSON object per line while it pulls: per layer a
status ("Pulling fs layer", "Waiting", "Already exists", "Downloading" with
`progressDetail` {current, total}, "Verifying Checksum", "Download
complete", "Extracting", "Pull complete"), lines about the whole image
("Pulling from ...", "Digest: ...", "Status: ..."), or `{"error": ...}`
when the pull fails half way. `PullTally` adds the layers up into a
`PullProgress`; `pull_image` makes the request and reports to the listener
when the pull begins, at most every REPORT_SECONDS while it runs, and once
when it is done.

The SDK's own `pull` sends the request with no timeout at all; this one
bounds every read by what is left of the budget, and a budget spent
closes the connection, which makes the engine give the pull up.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
import requests
from docker.auth import get_config_header, resolve_repository_name
from docker.utils import parse_repository_tag

from inventory.drivers.base import PermanentDriverError, PullListener, PullProgress, TransientDriverError
from inventory.drivers.docker._engine import Budget

log = logging.getLogger(__name__)

REPORT_SECONDS = 1.0
"""At most one progress report a second while a pull runs (plus the first and the last)."""

_LAYER_DONE = frozenset({"Already exists", "Pull complete"})
_DOWNLOADED = frozenset({"Verifying Checksum", "Download complete", "Extracting", "Pull complete"})
# What a registry answers when the image is not there or not for us: retrying cannot help.
_REFUSED = ("not found", "manifest unknown", "unauthorized", "denied")


@dataclass
class _Layer:
    current: int = 0
    total: int = 0
    done: bool = False


class PullTally:
    """What the engine said so far about one pull's layers, as counts and bytes."""

    def __init__(self, image: str, *, clock: Any = time.monotonic, wall_clock: Any = time.time) -> None:
        self.image = image
        self._clock = clock
        self._began = clock()
        self.began_at = float(wall_clock())
        self._layers: dict[str, _Layer] = {}

    def add(self, event: dict[str, Any]) -> None:
        """Take one decoded line of the engine's pull stream (an error line is the caller's to raise)."""
        layer, status = event.get("id"), str(event.get("status") or "")
        if not layer or status.startswith("Pulling from"):
            return  # a line about the whole image: its tag, digest or outcome
        state = self._layers.setdefault(str(layer), _Layer())
        detail = event.get("progressDetail") or {}
        if status == "Downloading" and isinstance(detail.get("total"), int) and detail["total"] > 0:
            state.total = int(detail["total"])
            state.current = min(int(detail.get("current") or 0), state.total)
        elif status in _DOWNLOADED:
            state.current = state.total
        if status in _LAYER_DONE:
            state.done = True

    def progress(self, *, done: bool = False) -> PullProgress:
        """Return where the pull stands now; `done` marks the last report of a pull that succeeded."""
        layers = self._layers.values()
        return PullProgress(
            image=self.image,
            began_at=self.began_at,
            seconds=round(self._clock() - self._began, 3),
            layers_done=sum(1 for layer in layers if layer.done or done),
            layers_total=len(self._layers),
            bytes_done=sum(layer.total if done else layer.current for layer in layers),
            bytes_total=sum(layer.total for layer in layers),
            done=done,
        )


class _Reports:
    """Hands progress to a listener at most every REPORT_SECONDS (the first and the last always)."""

    def __init__(self, listener: PullListener | None) -> None:
        self._listener = listener
        self._last: float | None = None

    def send(self, tally: PullTally, *, force: bool = False, done: bool = False) -> None:
        now = time.monotonic()
        if self._listener is None or not (force or self._last is None or now - self._last >= REPORT_SECONDS):
            return
        self._last = now
        try:
            self._listener(tally.progress(done=done))
        except Exception:
            # A report that could not be sent costs the page a progress figure, never the start.
            log.exception("reporting the pull of %s failed", tally.image)


def pull_image(api: docker.APIClient, image: str, budget: Budget, on_pull: PullListener | None = None) -> None:
    """Pull `image` within `budget`, telling `on_pull` how it goes (see `Runtime.start`).

    Raises PermanentDriverError `image_not_found` when the registry does
    not have it or refuses us, TransientDriverError `pull_failed` when the
    pull broke off (registry unreachable, connection lost), DriverTimeout
    when the budget runs out (the connection is closed, so the engine gives
    the pull up), and docker/requests errors for the caller's
    `engine_errors` to translate.
    """
    repository, tag = parse_repository_tag(image)
    registry, _ = resolve_repository_name(repository)
    header = get_config_header(api, registry)
    tally, reports = PullTally(image), _Reports(on_pull)
    reports.send(tally, force=True)
    left = budget.left()
    response = api.post(
        f"{api.base_url}/v{api.api_version}/images/create",
        params={"fromImage": repository, "tag": tag or "latest"},
        headers={"X-Registry-Auth": header} if header else {},
        stream=True,
        timeout=(left, left),
    )
    with closing(response):
        _raise_for_status(response, image)
        for line in _lines(response, budget):
            event = json.loads(line)
            if "error" in event:
                raise _pull_error(image, event)
            tally.add(event)
            reports.send(tally)
    reports.send(tally, force=True, done=True)


def _lines(response: requests.Response, budget: Budget) -> Any:
    """Yield the non-empty lines of the engine's stream, each read bounded by what is left of `budget`."""
    lines = response.iter_lines()
    while True:
        _bound_reads(response, budget.left())
        line = next(lines, None)
        if line is None:
            return
        if line.strip():
            yield line


def _bound_reads(response: requests.Response, seconds: float) -> None:
    """Let the next reads of `response` wait at most `seconds` (the request's timeout was set when it began)."""
    connection = getattr(response.raw, "connection", None)
    sock = getattr(connection, "sock", None)
    if sock is not None:
        sock.settimeout(seconds)


def _raise_for_status(response: requests.Response, image: str) -> None:
    """Raise for an engine that refused the pull at once: the registry has no such image, or it is unreachable."""
    try:
        response.raise_for_status()
    except requests.exceptions.HTTPError as error:
        try:
            docker.errors.create_api_error_from_http_exception(error)
        except docker.errors.NotFound as missing:
            explanation = missing.explanation or str(missing)
            raise PermanentDriverError(f"pulling {image}: {explanation}", code="image_not_found") from missing


def _pull_error(image: str, event: dict[str, Any]) -> PermanentDriverError | TransientDriverError:
    message = str((event.get("errorDetail") or {}).get("message") or event.get("error"))
    if any(word in message.lower() for word in _REFUSED):
        return PermanentDriverError(f"pulling {image}: {message}", code="image_not_found")
    return TransientDriverError(f"pulling {image}: {message}", code="pull_failed")
