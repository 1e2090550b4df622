"""Strict readers for settings taken from the environment.

Every helper returns the default when the variable is unset or empty, and
raises ImproperlyConfigured naming the variable when it is set to a value of
the wrong shape: a typo in a deployment must stop the process at start, not
fall back silently to a default.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def env_str(name: str, default: str | None = None) -> str | None:
    """Return the variable as a stripped string, or `default` when unset."""
    value = _raw(name)
    return default if value is None else value


def env_bool(name: str, default: bool) -> bool:
    """Return the variable as a boolean; accepts 1/0, true/false, yes/no, on/off."""
    value = _raw(name)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use 1/0, true/false, yes/no or on/off).")


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """Return the variable when it is one of `choices` (compared lower-case), `default` when unset."""
    value = _raw(name)
    if value is None:
        return default
    if value.lower() not in choices:
        raise ImproperlyConfigured(f"{name}={value!r} must be one of: {', '.join(choices)}.")
    return value.lower()


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return the variable as an integer within [minimum, maximum]."""
    value = _raw(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer.") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} is below the minimum of {minimum}.")
    if maximum is not None and number > maximum:
        raise ImproperlyConfigured(f"{name}={number} is above the maximum of {maximum}.")
    return number


def env_list(name: str, default: list[str]) -> list[str]:
    """Return a comma-separated variable as a list of non-empty, stripped items."""
    value = _raw(name)
    if value is None:
        return list(default)
    items = [item.strip() for item in value.split(",")]
    if any(item == "" for item in items):
        raise ImproperlyConfigured(f"{name}={value!r} has an empty item in its comma-separated list.")
    return items


def env_path(name: str, default: Path) -> Path:
    """Return the variable as an absolute path (relative ones resolve against the working directory)."""
    value = _raw(name)
    return default if value is None else Path(value).expanduser().resolve()


@dataclass(frozen=True)
class DatabaseUrl:
    """The parts of a DATABASE_URL that Django's DATABASES setting needs."""

    engine: str
    name: str
    user: str = ""
    password: str = ""
    host: str = ""
    port: str = ""
    options: tuple[tuple[str, str], ...] = ()


_ENGINES = {
    "postgres": "django.db.backends.postgresql",
    "postgresql": "django.db.backends.postgresql",
    "sqlite": "django.db.backends.sqlite3",
}


def parse_database_url(name: str, value: str) -> DatabaseUrl:
    """Parse `postgres://user:pass@host:port/db?opt=v` or `sqlite:///absolute/path`."""
    parts = urlsplit(value)
    engine = _ENGINES.get(parts.scheme)
    if engine is None:
        raise ImproperlyConfigured(f"{name} has scheme {parts.scheme!r}; use postgres:// or sqlite:///.")
    if parts.scheme == "sqlite":
        # sqlite:///relative.db and sqlite:////absolute/path.db, as dj-database-url reads them.
        path = unquote(parts.path)[1:]
        if not path or path == "/":
            raise ImproperlyConfigured(f"{name} must name a file, e.g. sqlite:////var/lib/gpucloud/db.sqlite3.")
        return DatabaseUrl(engine=engine, name=path)
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise ImproperlyConfigured(f"{name} must name a database, e.g. postgres://user:pass@host:5432/gpucloud.")
    try:
        port = parts.port
    except ValueError:
        raise ImproperlyConfigured(f"{name} has a port that is not a number.") from None
    return DatabaseUrl(
        engine=engine,
        name=database,
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        host=parts.hostname or "",
        port=str(port or ""),
        options=tuple(parse_qsl(parts.query)),
    )


def env_url(name: str, default: str | None, *, schemes: tuple[str, ...]) -> str | None:
    """Return the variable as a URL whose scheme is one of `schemes`."""
    value = _raw(name)
    if value is None:
        return default
    scheme = urlsplit(value).scheme
    if scheme not in schemes:
        raise ImproperlyConfigured(f"{name}={value!r} must start with one of: {', '.join(s + '://' for s in schemes)}.")
    return value


def secret_key(data_dir: Path, *, required: bool) -> str:
    """Return SECRET_KEY from the environment (50 characters at least), or the one kept in `data_dir`.

    With `required` (distributed with DEBUG off) a missing SECRET_KEY stops
    start-up; otherwise one is made once, owner-readable only (0600), and
    kept in `data_dir` (made or kept 0711: `private_data_dir`).
    """
    configured = env_str("SECRET_KEY")
    if configured is not None:
        if len(configured) < 50:
            raise ImproperlyConfigured("SECRET_KEY must be at least 50 characters long.")
        return configured
    if required:
        raise ImproperlyConfigured("SECRET_KEY is required when REDIS_URL is set and DEBUG is off.")
    key_file = private_data_dir(data_dir) / "secret_key"
    try:
        # Created owner-only before a byte is written: never readable by others, not even briefly.
        fd = os.open(key_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, PRIVATE_FILE_MODE)
    except FileExistsError:
        _tighten(key_file, PRIVATE_FILE_MODE)  # one kept by an older version, or copied in with looser bits
    else:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(64))
    return key_file.read_text().strip()


# The console's data directory: others (a process-runtime workload's user) may pass through it to their own
# volumes and workload directory, whose names they are given, but never list it or read what is in it.
DATA_DIR_MODE = 0o711
PRIVATE_FILE_MODE = 0o600


def private_data_dir(data_dir: Path) -> Path:
    """Make `data_dir` (with its parents) if missing and keep it DATA_DIR_MODE (0711); return it.

    An existing one that this process's user owns loses any read or write
    bit of its group and others; one another user owns is left as it is.
    """
    data_dir.mkdir(mode=DATA_DIR_MODE, parents=True, exist_ok=True)
    _tighten(data_dir, DATA_DIR_MODE)
    return data_dir


def private_file(path: Path) -> None:
    """Make `path` an owner-only file (0600): created empty when missing, an existing one's extra bits removed.

    For the SQLite ledger: SQLite takes an empty file as a new database,
    and gives its journal files the database file's permissions.
    """
    private_data_dir(path.parent)
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, PRIVATE_FILE_MODE))
    _tighten(path, PRIVATE_FILE_MODE)


def _tighten(path: Path, allowed: int) -> None:
    """Clear the permission bits of `path` outside `allowed` when this process's user owns it.

    A sticky directory (/tmp, given as a data directory) is shared by design and left as it is.
    """
    found = path.stat()
    mode = stat.S_IMODE(found.st_mode)
    if found.st_uid == os.geteuid() and mode & ~allowed and not mode & stat.S_ISVTX:
        path.chmod(mode & allowed)


def _loopback(host: str) -> bool:
    """Return whether an ALLOWED_HOSTS entry names only this machine (localhost, 127.0.0.0/8, ::1)."""
    name = host.lower().strip("[]")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def loopback_only(hosts: list[str]) -> bool:
    """Return whether `hosts` names at least one host and none but this machine's loopback names."""
    return bool(hosts) and all(_loopback(host) for host in hosts)


def env_networks(name: str) -> list[str]:
    """Return the list variable `name` (empty by default), each item checked to be an address or a CIDR network."""
    networks = env_list(name, [])
    for network in networks:
        try:
            ipaddress.ip_network(network, strict=False)
        except ValueError:
            raise ImproperlyConfigured(
                f"{name} has {network!r}, which is not an address or a network (e.g. 10.0.0.0/8)."
            ) from None
    return networks


_RATE = re.compile(r"[1-9][0-9]{0,8}/(s|sec|second|m|min|minute|h|hour|d|day)")


def env_rate(name: str, default: str) -> str | None:
    """Return the rate the variable `name` sets (COUNT/PERIOD, e.g. 1200/min), or None for `off`."""
    rate = env_str(name, default) or default
    if rate.lower() == "off":
        return None
    if not _RATE.fullmatch(rate):
        raise ImproperlyConfigured(f"{name}={rate!r} is not a rate such as 1200/min (or off).")
    return rate
