"""The contexts file: which consoles a person has logged in to, with which token, tenant and project.

The file is `$GPUCLOUD_CONFIG`, else `$XDG_CONFIG_HOME/gpucloud/config.yaml`, else
`~/.config/gpucloud/config.yaml`. It holds API tokens, so it is written atomically (a temporary file in the
same directory, then a rename) with mode 0600 inside a 0700 directory, and one that others may read is
refused on load, as ssh refuses a private key others may read. Its shape:

    current: prod
    contexts:
      prod: {url: https://gpu.example.com, token: gpc_..., tenant: acme, project: vision}
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpucloud_client.errors import EXIT_FAILED, ConfigError

_TOKEN = re.compile(r"^gpc_([A-Za-z0-9]+)_")
ENV_CONTEXT = "GPUCLOUD_CONTEXT"
ENV_URL = "GPUCLOUD_URL"
ENV_TOKEN = "GPUCLOUD_TOKEN"  # noqa: S105 - the variable's name, not a secret
ENV_TENANT = "GPUCLOUD_TENANT"
ENV_PROJECT = "GPUCLOUD_PROJECT"
ENV_ONLY_CONTEXT = "env"  # the name of a context made from environment variables alone


def redact(token: str) -> str:
    """Return a token as it may be shown: `gpc_<prefix>_…` (the prefix identifies it, the secret stays out)."""
    match = _TOKEN.match(token)
    return f"gpc_{match.group(1)}_…" if match else "…"


def normalize_url(url: str) -> str:
    """Return a console URL without its trailing slash; raises ConfigError unless it is http(s)://host."""
    parts = urlsplit(url.strip())
    if parts.scheme not in {"http", "https"} or not parts.netloc:
        raise ConfigError(f"the console URL must be http(s)://host[:port], not {url!r}", exit_code=EXIT_FAILED)
    return url.strip().rstrip("/")


@dataclass
class Context:
    """One console login: where (`url`), as whom (`token`), and the default tenant and project."""

    name: str
    url: str
    token: str = field(repr=False)  # never in a repr: reprs end up in tracebacks and logs
    tenant: str | None = None
    project: str | None = None

    @property
    def api_url(self) -> str:
        """Return the API's base URL, ending in `/api/v1/`."""
        return f"{self.url.rstrip('/')}/api/v1/"

    @property
    def ws_url(self) -> str:
        """Return the console's WebSocket base (`ws://host` or `wss://host`, with any path prefix)."""
        parts = urlsplit(self.url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        return f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}"

    def to_json(self) -> dict[str, Any]:
        """Return the context as stored in the file (the name is the key, so not in here)."""
        return {"url": self.url, "token": self.token, "tenant": self.tenant, "project": self.project}

    def describe(self) -> dict[str, Any]:
        """Return what may be shown of the context: the token redacted."""
        return {**self.to_json(), "name": self.name, "token": redact(self.token)}


def default_path(environ: Mapping[str, str] | None = None) -> Path:
    """Return where the contexts file lives for this environment (see the module's docstring)."""
    env = os.environ if environ is None else environ
    if env.get("GPUCLOUD_CONFIG"):
        return Path(env["GPUCLOUD_CONFIG"]).expanduser()
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "gpucloud" / "config.yaml"


class Config:
    """The contexts of the file at `path` and which is current; change it, then `save()`."""

    def __init__(
        self, contexts: dict[str, Context] | None = None, current: str | None = None, path: Path | None = None
    ):
        self.contexts: dict[str, Context] = contexts or {}
        self.current = current
        self.path = path or default_path()

    @classmethod
    def load(cls, path: Path | str | None = None) -> Config:
        """Return the file's contexts (none when there is no file).

        Raises ConfigError for a file that group or others may access, or one that is not a contexts file.
        """
        where = Path(path) if path is not None else default_path()
        try:
            info = where.stat()
        except FileNotFoundError:
            return cls(path=where)
        if os.name == "posix" and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            mode = stat.S_IMODE(info.st_mode)
            raise ConfigError(
                f"{where} holds API tokens but its mode is {mode:04o}: others may read it; "
                f"run `chmod 600 {where}` (it is refused until then)",
                exit_code=EXIT_FAILED,
            )
        return cls._parse(where, where.read_text(encoding="utf-8"))

    @classmethod
    def _parse(cls, where: Path, text: str) -> Config:
        import yaml  # imported here: the CLI's start-up must not pay for it

        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{where} is not valid YAML: {exc}", exit_code=EXIT_FAILED) from None
        raw = data.get("contexts") if isinstance(data, dict) else None
        if not isinstance(raw, dict):
            raise ConfigError(f"{where} has no `contexts` mapping", exit_code=EXIT_FAILED)
        contexts = {str(name): _context_from(where, str(name), value) for name, value in raw.items()}
        current = data.get("current")
        return cls(contexts, current if isinstance(current, str) and current in contexts else None, where)

    def save(self) -> Path:
        """Write the file atomically, mode 0600 in a 0700 directory; return its path."""
        import yaml

        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.path.parent.name == "gpucloud":
            # Our own directory: tighten it even when something else created it wider.
            os.chmod(self.path.parent, 0o700)
        data = {"current": self.current, "contexts": {n: c.to_json() for n, c in sorted(self.contexts.items())}}
        text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
        fd, tmp = tempfile.mkstemp(prefix=".config-", suffix=".tmp", dir=self.path.parent)  # created 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return self.path

    def add(self, context: Context, *, make_current: bool = True) -> None:
        """Store `context` under its name (replacing one of the same name); make it current unless told not."""
        self.contexts[context.name] = context
        if make_current or self.current is None:
            self.current = context.name

    def remove(self, name: str) -> Context:
        """Forget context `name` and return it; raises ConfigError when there is none of that name."""
        if name not in self.contexts:
            raise ConfigError(f"no context named {name!r}; `gpc contexts` lists them", exit_code=EXIT_FAILED)
        removed = self.contexts.pop(name)
        if self.current == name:
            self.current = next(iter(sorted(self.contexts)), None)
        return removed

    def use(self, name: str) -> None:
        """Make context `name` current; raises ConfigError when there is none of that name."""
        if name not in self.contexts:
            raise ConfigError(f"no context named {name!r}; `gpc contexts` lists them", exit_code=EXIT_FAILED)
        self.current = name

    def resolve(self, name: str | None = None, environ: Mapping[str, str] | None = None) -> Context:
        """Return the context to use, with the environment's overrides applied.

        The context is `name` (the CLI's --context), else $GPUCLOUD_CONTEXT, else the current one. Then
        GPUCLOUD_URL, GPUCLOUD_TOKEN, GPUCLOUD_TENANT and GPUCLOUD_PROJECT override its fields; with no
        context at all, GPUCLOUD_URL and GPUCLOUD_TOKEN alone make one (named "env"), for CI scripts.
        Raises ConfigError (EXIT_AUTH) when that leaves no URL or token.
        """
        env = os.environ if environ is None else environ
        chosen = name or env.get(ENV_CONTEXT) or None
        if chosen is not None and chosen not in self.contexts:
            known = ", ".join(sorted(self.contexts)) or "none"
            raise ConfigError(f"no context named {chosen!r} in {self.path} (known: {known})")
        base = self.contexts.get(chosen or self.current or "")
        url = env.get(ENV_URL) or (base.url if base else "")
        token = env.get(ENV_TOKEN) or (base.token if base else "")
        if not url or not token:
            raise ConfigError(f"not logged in: run `gpc login URL`, or set {ENV_URL} and {ENV_TOKEN}")
        return Context(
            name=base.name if base else ENV_ONLY_CONTEXT,
            url=normalize_url(url),
            token=token,
            tenant=env.get(ENV_TENANT) or (base.tenant if base else None),
            project=env.get(ENV_PROJECT) or (base.project if base else None),
        )


def _context_from(where: Path, name: str, value: Any) -> Context:
    if not isinstance(value, dict) or not isinstance(value.get("url"), str) or not isinstance(value.get("token"), str):
        raise ConfigError(f"{where}: context {name!r} needs a `url` and a `token`", exit_code=EXIT_FAILED)
    tenant, project = value.get("tenant"), value.get("project")
    return Context(
        name=name,
        url=value["url"],
        token=value["token"],
        tenant=tenant if isinstance(tenant, str) else None,
        project=project if isinstance(project, str) else None,
    )
