"""The notebook proxy's upstream client, as the proxy sees it: what a client offers and how it fails.

Two clients keep this contract: the lean h11 one (`jobs.fast_upstream`,
the fast path `proxy_client`) and httpx (`jobs.upstream_httpx`, which
serves with that fast path off). `jobs.proxy` picks one; everything else
names only what is here. tests/jobs/test_upstream.py holds both clients
to the same scripted servers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

MAX_IDLE_PER_HOST = 16
"""Kept-alive connections kept per upstream server; more are closed after use."""


class UpstreamAnswer(Protocol):
    """A response whose head has arrived, from either client (`UpstreamResponse`, the httpx one)."""

    status: int
    headers: list[tuple[bytes, bytes]]

    def body(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class Upstream(Protocol):
    """The proxy's upstream client: `jobs.fast_upstream.UpstreamPool` or `jobs.upstream_httpx.HttpxUpstreamPool`."""

    async def request(
        self, method: str, url: str, headers: list[tuple[str, str]], body: AsyncIterator[bytes] | None
    ) -> UpstreamAnswer: ...

    def close(self) -> None: ...


class UpstreamError(Exception):
    """The upstream could not be reached, broke off, or spoke broken HTTP."""


class UpstreamTimeout(UpstreamError):
    """The upstream did not connect, or stayed silent, for longer than allowed."""
