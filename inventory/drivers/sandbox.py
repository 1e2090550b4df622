"""What a sandbox may see and be: its mounts, its user, its working directory and its stop signal.

`check_sandbox` runs in every runtime's `start` before anything is made:
a spec it refuses never reaches the engine. Errors are `policy.SpecRefused`
naming the field and the rule, as the rest of the policy's.
"""

from __future__ import annotations

import itertools
import posixpath

from inventory.drivers.base import STOP_SIGNALS, Mount, RunAs, WorkloadSpec
from inventory.drivers.policy import RULE_HOST_PATH, RULE_INVALID_VALUE, RULE_ROOT_USER, SpecRefused

MAX_MOUNTS = 64
MAX_GROUPS = 32
MAX_PATH_CHARS = 4096
MAX_ID = 2**31 - 1
# Where the kernel's and the engine's own file systems sit inside a sandbox: nothing may be mounted over them.
_SYSTEM_TARGETS = ("/proc", "/sys", "/dev")


def check_sandbox(spec: WorkloadSpec) -> None:
    """Return None when `spec`'s mounts, user, working directory and stop signal are acceptable; raise SpecRefused.

    `stop_signal` must be one of STOP_SIGNALS; `run_as` ids are integers in
    [1, 2^31 - 1] (`root_user` for 0: root, or the root group, is never
    granted) with at most MAX_GROUPS groups; `workdir` is "" or an
    absolute, normalised path. Each mount (`mounts[i].source`, `.target`,
    `.root`) has absolute, normalised paths, a `source` strictly below its
    `root` (`host_path`), a `target` that is not `/` nor under /proc,
    /sys or /dev, and its directory's owner (`uid` and `gid`, both or
    neither, may be root: it owns a directory, it runs nothing) and `mode`
    in range; no two targets, and no two sources, are one inside the
    other (a workload writing one volume could otherwise plant a symlink
    where the other is bound).
    """
    if spec.stop_signal not in STOP_SIGNALS:
        raise SpecRefused("stop_signal", RULE_INVALID_VALUE, f"must be one of {', '.join(STOP_SIGNALS)}")
    if spec.run_as is not None:
        _check_run_as(spec.run_as)
    if spec.workdir:
        _check_absolute("workdir", spec.workdir)
    if len(spec.mounts) > MAX_MOUNTS:
        raise SpecRefused("mounts", RULE_INVALID_VALUE, f"at most {MAX_MOUNTS} mounts")
    for index, mount in enumerate(spec.mounts):
        _check_mount(f"mounts[{index}]", mount)
    _check_apart("target", [mount.target for mount in spec.mounts])
    _check_apart("source", [mount.source for mount in spec.mounts])


def _check_run_as(run_as: RunAs) -> None:
    if len(run_as.groups) > MAX_GROUPS:
        raise SpecRefused("run_as.groups", RULE_INVALID_VALUE, f"at most {MAX_GROUPS} groups")
    named = [("run_as.uid", run_as.uid), ("run_as.gid", run_as.gid)]
    named += [(f"run_as.groups[{index}]", group) for index, group in enumerate(run_as.groups)]
    for field, value in named:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
            raise SpecRefused(field, RULE_INVALID_VALUE, f"must be an integer in [1, {MAX_ID}]")
        if value == 0:
            raise SpecRefused(field, RULE_ROOT_USER, "workloads never run as root or in the root group")


def _check_absolute(field: str, path: object) -> str:
    """Return `path` when it is an absolute, normalised path (no `..`, `.`, `//`, trailing `/`, NUL)."""
    if (
        not isinstance(path, str)
        or "\0" in path
        or len(path) > MAX_PATH_CHARS
        or not path.startswith("/")
        or path.startswith("//")
        or posixpath.normpath(path) != path
    ):
        raise SpecRefused(field, RULE_INVALID_VALUE, "must be an absolute, normalised path")
    return path


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _check_mount(field: str, mount: Mount) -> None:
    target = _check_absolute(f"{field}.target", mount.target)
    if target == "/" or any(_within(target, system) for system in _SYSTEM_TARGETS):
        raise SpecRefused(f"{field}.target", RULE_INVALID_VALUE, "cannot mount over / or /proc, /sys, /dev")
    source = _check_absolute(f"{field}.source", mount.source)
    root = _check_absolute(f"{field}.root", mount.root)
    if source == root or not _within(source, root):
        raise SpecRefused(f"{field}.source", RULE_HOST_PATH, f"must be below its storage root {root}")
    if not isinstance(mount.read_only, bool):
        raise SpecRefused(f"{field}.read_only", RULE_INVALID_VALUE, "must be true or false")
    if not isinstance(mount.marker, str) or "\0" in mount.marker or len(mount.marker) > MAX_PATH_CHARS:
        raise SpecRefused(f"{field}.marker", RULE_INVALID_VALUE, "must be a string without NUL")
    if (mount.uid is None) != (mount.gid is None):
        raise SpecRefused(f"{field}.uid", RULE_INVALID_VALUE, "uid and gid come together")
    for name, value, top in (("uid", mount.uid, MAX_ID), ("gid", mount.gid, MAX_ID), ("mode", mount.mode, 0o7777)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top):
            raise SpecRefused(f"{field}.{name}", RULE_INVALID_VALUE, f"must be an integer in [0, {top}]")


def _check_apart(what: str, paths: list[str]) -> None:
    for one, other in itertools.combinations(paths, 2):
        inner, outer = (one, other) if len(one) >= len(other) else (other, one)
        if _within(inner, outer):
            raise SpecRefused("mounts", RULE_INVALID_VALUE, f"{what} {inner} is inside (or is) {what} {outer}")
