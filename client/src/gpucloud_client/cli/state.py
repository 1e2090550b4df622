"""What every `gpc` command shares: the global options, and the context and clients built from them.

Only the standard library at module level: `gpc --help` imports this module, and the library (httpx,
yaml, websockets) is imported the first time a command actually needs a client.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpucloud_client.aclient import AsyncClient
    from gpucloud_client.client import Client
    from gpucloud_client.config import Config, Context

OUTPUT_FORMATS = ("table", "json", "yaml")


@dataclass
class AppState:
    """The global options of one `gpc` invocation, and the context they resolve to (resolved once, lazily).

    `transport` (and `client_options`) are handed to every client made here: tests inject failures through
    it (an `httpx.MockTransport`); it is None in real use.
    """

    context_name: str | None = None
    output: str = "table"
    tenant: str | None = None
    project: str | None = None
    transport: Any = None
    # Extra keyword arguments of every client made here (tests shorten the retry back-off with them).
    client_options: dict[str, Any] = field(default_factory=dict)
    _context: Context | None = field(default=None, repr=False)
    # Tokens this run knows of, so that error rendering can scrub them even from a server's message.
    secrets: list[str] = field(default_factory=list, repr=False)

    @property
    def structured(self) -> bool:
        """Return whether the output is for scripts (`-o json` or `-o yaml`) rather than people."""
        return self.output != "table"

    def config(self) -> Config:
        """Return the contexts file as it is now (raises ConfigError for an unsafe or malformed one)."""
        from gpucloud_client.config import Config

        return Config.load()

    def context(self) -> Context:
        """Return the context to talk to: --context or the current one, env overrides, then --tenant/--project.

        Raises ConfigError (exit code EXIT_AUTH) when nothing says which console or token to use.
        """
        if self._context is None:
            resolved = self.config().resolve(self.context_name)
            overrides = {k: v for k, v in (("tenant", self.tenant), ("project", self.project)) if v}
            self._context = dataclasses.replace(resolved, **overrides)
            self.secrets.append(self._context.token)
        return self._context

    def client(self, context: Context | None = None) -> Client:
        """Return a sync client for `context` (default: this run's context)."""
        from gpucloud_client.client import Client

        return Client(context or self.context(), transport=self.transport, **self.client_options)

    def aclient(self, context: Context | None = None) -> AsyncClient:
        """Return an async client for `context` (default: this run's context)."""
        from gpucloud_client.aclient import AsyncClient

        return AsyncClient(context or self.context(), transport=self.transport, **self.client_options)

    def for_tenant(self, tenant: str | None) -> Context:
        """Return this run's context aimed at `tenant` (the context itself when None or the same)."""
        context = self.context()
        if not tenant or tenant == context.tenant:
            return context
        return dataclasses.replace(context, tenant=tenant)
