"""The shape of every protocol message per version, and the checked-in snapshot of it.

`shapes()` describes each message (field names, types, defaults, bounds) from
its class; `schema.json` beside this module pins the shape of every version
of every message, and the tests compare the classes with it. After changing a
message and raising its VERSION, add the new version to it:

    .venv/bin/python -m common.protocol.schema --write

which refuses to change the shape a version already pins.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, get_args, get_origin

from common.protocol.messages import ALL
from common.protocol.wire import Bounds, Record

SNAPSHOT = Path(__file__).with_name("schema.json")


def type_name(tp: Any) -> str:
    """Return a stable spelling of the field type `tp` (`list[str]`, `int | None`, `Literal['a', 'b']`)."""
    if tp is Any:
        return "Any"
    origin = get_origin(tp)
    if origin is typing.Literal:
        return f"Literal[{', '.join(map(repr, get_args(tp)))}]"
    if origin is not None:
        args = get_args(tp)
        if origin in (typing.Union, types.UnionType):
            return " | ".join(type_name(arg) for arg in args)
        return f"{origin.__name__}[{', '.join(type_name(arg) for arg in args)}]"
    if tp is type(None):
        return "None"
    return str(tp.__name__)


def record_shape(cls: type[Record]) -> dict[str, Any]:
    """Return {field: {type, default, bounds}} of `cls`, nested records spelled out."""
    hints = typing.get_type_hints(cls)
    shape: dict[str, Any] = {}
    for spec in dataclasses.fields(cls):
        entry: dict[str, Any] = {"type": type_name(hints[spec.name])}
        if spec.default is not dataclasses.MISSING:
            entry["default"] = spec.default
        elif spec.default_factory is not dataclasses.MISSING:
            entry["default"] = spec.default_factory()
        bounds = spec.metadata.get("bounds")
        if bounds is not None and bounds != Bounds():
            entry["bounds"] = {k: v for k, v in dataclasses.asdict(bounds).items() if v is not None}
        nested = [arg for arg in _leaves(hints[spec.name]) if isinstance(arg, type) and issubclass(arg, Record)]
        if nested:
            entry["fields"] = record_shape(nested[0])
        shape[spec.name] = entry
    return shape


def _leaves(tp: Any) -> list[Any]:
    args = get_args(tp)
    return [leaf for arg in args for leaf in _leaves(arg)] if args else [tp]


def shapes() -> dict[str, dict[str, Any]]:
    """Return {task name: {version: shape}} of every message as it is now (one version each)."""
    return {task: {str(cls.VERSION): record_shape(cls)} for task, cls in sorted(ALL.items())}


def load_snapshot() -> dict[str, dict[str, Any]]:
    """Return the checked-in shapes: {task name: {version: shape}}, every version ever pinned."""
    loaded: dict[str, dict[str, Any]] = json.loads(SNAPSHOT.read_text()) if SNAPSHOT.exists() else {}
    return loaded


def changed_without_version(pinned: dict[str, dict[str, Any]]) -> list[str]:
    """Return the task names whose shape differs from the one `pinned` holds for their current version."""
    return [
        task
        for task, versions in shapes().items()
        for version, shape in versions.items()
        if version in pinned.get(task, {}) and pinned[task][version] != json.loads(json.dumps(shape))
    ]


def merged(pinned: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Return `pinned` with the current version of every message added (older versions kept)."""
    result = {task: dict(versions) for task, versions in pinned.items()}
    for task, versions in shapes().items():
        result.setdefault(task, {}).update(versions)
    return result


def main(argv: list[str]) -> int:
    """Print the current shapes as JSON; with `--write`, add them to the snapshot, which refuses a changed
    shape under a version it already pins (raise the message's VERSION instead)."""
    if "--write" not in argv:
        sys.stdout.write(json.dumps(shapes(), indent=2, sort_keys=True) + "\n")
        return 0
    pinned = load_snapshot()
    changed = changed_without_version(pinned)
    if changed:
        sys.stderr.write(f"changed without a new VERSION: {', '.join(changed)}\n")
        return 1
    SNAPSHOT.write_text(json.dumps(merged(pinned), indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
