"""The node's credential file: where the console is, which node this host is, and the secret that proves it.

JSON `{"console", "node", "credential", "ca_file"?, "sample_seconds"?,
"heartbeat_seconds"?}`, readable by its owner only. It is created that way
(never world- or group-readable, not even briefly), an existing one is only
replaced when asked (`force`), and one that others could read, or that
another user owns (they could point this agent at a console of theirs), is
refused rather than used.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from inventory.agent.remote import RemoteAgentError

SYSTEM_PATH = Path("/var/lib/gpucloud/agent/credential.json")
USER_PATH = Path(".config/gpucloud/agent.json")  # under the user's home


class CredentialFileError(RemoteAgentError):
    """The credential file cannot be written or used as it is; the message says what to do."""


@dataclass(frozen=True)
class Credential:
    """What `gpucloud agent join` stored: the console's URL, this host's node name and its credential."""

    console: str
    node: str
    credential: str
    ca_file: str | None = None
    sample_seconds: float | None = None
    heartbeat_seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {name: value for name, value in asdict(self).items() if value is not None}

    @classmethod
    def from_json(cls, data: Any, *, path: Path) -> Credential:
        """Return the credential `data` (a parsed file) holds; raises CredentialFileError naming `path`."""
        try:
            return cls(
                console=str(data["console"]),
                node=str(data["node"]),
                credential=str(data["credential"]),
                ca_file=_optional(data.get("ca_file"), str),
                sample_seconds=_optional(data.get("sample_seconds"), float),
                heartbeat_seconds=_optional(data.get("heartbeat_seconds"), float),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise CredentialFileError(f"{path} is not an agent credential file ({error!r}): join again") from None


def _optional(value: Any, kind: type[Any]) -> Any:
    return None if value is None else kind(value)


def default_credential_path() -> Path:
    """Return where the credential lives by default: the system path for root, the user's config otherwise."""
    if os.geteuid() == 0:
        return SYSTEM_PATH
    return Path.home() / USER_PATH


def default_work_dir(credential_path: Path, node: str) -> Path:
    """Return the agent's work directory (its spool, the process runtime's files) beside its credential file.

    Each credential file has its own: two agents started from different
    files never share a spool.
    """
    return credential_path.parent / node


def prepare_path(path: Path, *, force: bool) -> None:
    """Make `path` ready to take a credential: missing directories made 0700, an existing file refused.

    Raises CredentialFileError when `path` exists and `force` is off; done
    before a join, so that a token is never spent on a file that cannot be written.
    """
    if not force and os.path.lexists(path):
        raise CredentialFileError(f"{path} already exists: pass --force to replace it, or --credential-file elsewhere")
    try:
        _make_private_dirs(path.parent)
    except OSError as error:
        raise CredentialFileError(f"cannot create {path.parent}: {error.strerror}") from None


def save_credential(path: Path, credential: Credential, *, force: bool = False) -> None:
    """Write `credential` to `path`, owner-only (0600, missing directories 0700).

    Raises CredentialFileError when the file exists and `force` is off. With
    `force` the new file replaces the old one atomically (written aside,
    then renamed over it).
    """
    prepare_path(path, force=force)
    data = (json.dumps(credential.to_json(), indent=2) + "\n").encode()
    if not force:
        _write_new(path, data)
        return
    aside = path.with_name(f".{path.name}.{os.getpid()}.new")
    with contextlib.suppress(FileNotFoundError):
        aside.unlink()
    _write_new(aside, data)
    os.replace(aside, path)


def load_credential(path: Path) -> Credential:
    """Return the credential stored at `path`; raises CredentialFileError when it is missing or not private."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise CredentialFileError(f"no credential at {path}: run `gpucloud agent join CONSOLE_URL TOKEN`") from None
    except OSError as error:
        raise CredentialFileError(f"cannot open {path}: {error.strerror}") from None
    with os.fdopen(descriptor, "rb") as handle:
        _check_private(path, os.fstat(handle.fileno()))
        raw = handle.read()
    try:
        data = json.loads(raw)
    except ValueError:
        raise CredentialFileError(f"{path} is not JSON: join again") from None
    return Credential.from_json(data, path=path)


def _check_private(path: Path, info: os.stat_result) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise CredentialFileError(f"{path} is not a regular file")
    if info.st_uid != os.geteuid():
        raise CredentialFileError(f"{path} belongs to uid {info.st_uid}, not to this user: chown it or join again")
    if info.st_mode & 0o077:
        mode = oct(stat.S_IMODE(info.st_mode))
        raise CredentialFileError(f"{path} is readable by others (mode {mode}): run `chmod 600 {path}` and start again")


def _write_new(path: Path, data: bytes) -> None:
    """Create `path` owner-only (failing if it exists) and write `data` to it, flushed to disk."""
    try:
        descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        raise CredentialFileError(f"{path} already exists: pass --force to replace it") from None
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _make_private_dirs(directory: Path) -> None:
    """Create `directory` and its missing parents, each owner-only (existing ones are left as they are)."""
    missing = [parent for parent in [directory, *directory.parents] if not parent.exists()]
    for parent in reversed(missing):
        try:
            parent.mkdir(mode=0o700)
        except FileExistsError:
            continue  # made meanwhile by someone else: theirs to keep as it is
        parent.chmod(0o700)  # mkdir's mode passes through the umask
