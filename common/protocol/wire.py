"""Typed (de)serialisation of protocol messages: frozen dataclasses to and from JSON-able dicts.

A message class declares its fields with types; `from_wire` checks a dict
against them and refuses it with one `ProtocolError` naming every bad field
(type, range, unknown value, unknown or missing key). The checks are driven
by the annotations and by `bounded` metadata, so a field's rule is written
once, beside the field:

- `int`: a JSON integer (never a boolean) in `lo..hi` (default 0..2**63-1);
- `float`: a finite JSON number in `lo..hi` when given;
- `str`: at most `max_len` characters (default DEFAULT_STR);
- `list[X]` / `tuple[X, ...]`: a JSON array of at most `max_len` items
  (default DEFAULT_ITEMS), each checked as X;
- `dict[str, X]`: an object of at most `max_len` entries;
- `Literal[...]`: one of the listed values;
- `X | None`, nested dataclasses, and `Any` (any JSON value: an opaque
  driver handle, a probe request).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal, Self, TypeVar, Union, dataclass_transform, get_args, get_origin

DEFAULT_STR = 65_536
DEFAULT_ITEMS = 10_000
INT_MAX = 2**63 - 1


class ProtocolError(ValueError):
    """A message that does not fit its class; `problems` maps each bad field's path to what is wrong."""

    def __init__(self, message: str, problems: Mapping[str, str]) -> None:
        self.message, self.problems = message, dict(problems)
        super().__init__(f"{message}: " + "; ".join(f"{path}: {why}" for path, why in self.problems.items()))


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The range of a number field, or the most characters, items or entries of a string, list or object."""

    lo: float | None = None
    hi: float | None = None
    max_len: int | None = None


def bounded(
    *, default: Any = dataclasses.MISSING, lo: float | None = None, hi: float | None = None, max_len: int | None = None
) -> Any:
    """Return a dataclass field with its `Bounds`; a list or dict default becomes a factory (a fresh one each)."""
    meta = {"bounds": Bounds(lo=lo, hi=hi, max_len=max_len)}
    if isinstance(default, list | dict):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


_R = TypeVar("_R")


# The type checker reads `bounded` as a field (with a default only when one is given), as it does `field`.
@dataclass_transform(frozen_default=True, field_specifiers=(bounded, dataclasses.field))
def record(cls: type[_R]) -> type[_R]:
    """Make `cls` a protocol record: a frozen dataclass."""
    return dataclasses.dataclass(frozen=True)(cls)


@record
class Record:
    """A typed JSON object: a message, or a part of one (a mount of a start, a batch of a log report)."""

    def to_wire(self) -> dict[str, Any]:
        """Return this record as a JSON-able dict (tuples become lists, nested records dicts)."""
        return {f.name: _encode(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_wire(cls, data: Any) -> Self:
        """Return the record `data` describes; raises ProtocolError naming every field that does not fit."""
        problems: dict[str, str] = {}
        value = _decode_record(cls, data, "", problems)
        if problems:
            raise ProtocolError(cls.__name__, problems)
        return typing.cast(Self, value)


@record
class Message(Record):
    """A message between the controller and an agent: its name and the version of its shape.

    `TASK` is the Celery task that carries it, or for telemetry that is no task (a heartbeat), the gateway's
    message kind.
    """

    TASK: ClassVar[str]
    VERSION: ClassVar[int]

    @classmethod
    def from_wire(cls, data: Any, *, version: int | None = None) -> Self:
        """Like `Record.from_wire`; a `version` other than the class's (None: the sender named none) is refused."""
        if version is not None and version != cls.VERSION:
            raise ProtocolError(cls.TASK, {"version": f"{version!r} is not {cls.VERSION}, the version this side reads"})
        problems: dict[str, str] = {}
        value = _decode_record(cls, data, "", problems)
        if problems:
            raise ProtocolError(cls.TASK, problems)
        return typing.cast(Self, value)


def _encode(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_wire()
    if isinstance(value, list | tuple):
        return [_encode(item) for item in value]
    if isinstance(value, dict):
        return {key: _encode(item) for key, item in value.items()}
    return value


Decoder = Callable[[Any, str, dict[str, str]], Any]
"""Checks one value at a path: returns it decoded (records built), noting any problem in the dict it is given."""


_RECORD_DECODERS: dict[type, Decoder] = {}


def _record_decoder(cls: type) -> Decoder:
    """Return the decoder of the record class `cls`, built once from its fields (decoding is on the hot path)."""
    found = _RECORD_DECODERS.get(cls)
    if found is None:
        found = _RECORD_DECODERS[cls] = _build_record_decoder(cls)  # two threads may both build it: harmless
    return found


def _build_record_decoder(cls: type) -> Decoder:
    hints = typing.get_type_hints(cls)
    fields = [
        (
            spec.name,
            _decoder(hints[spec.name], spec.metadata.get("bounds") or Bounds()),
            spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING,
        )
        for spec in dataclasses.fields(cls)
    ]
    known = {name for name, _, _ in fields}

    def decode(data: Any, path: str, problems: dict[str, str]) -> Any:
        if not isinstance(data, dict):
            problems[path or "(message)"] = "must be an object"
            return None
        before = len(problems)
        for key in data.keys() - known:
            problems[_join(path, str(key))] = "is not a field of this message"
        values: dict[str, Any] = {}
        for name, field_decoder, required in fields:
            if name in data:
                values[name] = field_decoder(data[name], _join(path, name), problems)
            elif required:
                problems[_join(path, name)] = "is missing"
        return cls(**values) if len(problems) == before else None

    return decode


def _decode_record(cls: type[Record], data: Any, path: str, problems: dict[str, str]) -> Record | None:
    decoded: Record | None = _record_decoder(cls)(data, path, problems)
    return decoded


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


@functools.cache
def _decoder(tp: Any, bounds: Bounds) -> Decoder:
    """Return the decoder of values of type `tp` within `bounds` (one per type and bounds, built once)."""
    origin = get_origin(tp)
    if tp is Any:
        return _json
    if origin in (Union, types.UnionType):
        (inner,) = [option for option in get_args(tp) if option is not type(None)]
        decode_inner = _decoder(inner, bounds)
        return lambda value, path, problems: None if value is None else decode_inner(value, path, problems)
    if origin is Literal:
        return _literal(get_args(tp))
    if origin in (list, tuple):
        return _sequence(_decoder(get_args(tp)[0], Bounds()), bounds, as_tuple=origin is tuple)
    if origin is dict:
        return _mapping(_decoder(get_args(tp)[1], Bounds()), bounds)
    if isinstance(tp, type) and issubclass(tp, Record):
        return _record_decoder(tp)
    return _scalar(tp, bounds)


def _literal(choices: tuple[Any, ...]) -> Decoder:
    allowed = {(type(choice), choice) for choice in choices}
    message = f"must be one of {', '.join(map(repr, choices))}"

    def decode(value: Any, path: str, problems: dict[str, str]) -> Any:
        try:
            known = (type(value), value) in allowed
        except TypeError:  # an unhashable value (a list, an object) is no choice
            known = False
        if not known:
            problems[path] = message
        return value

    return decode


def _sequence(item: Decoder, bounds: Bounds, *, as_tuple: bool) -> Decoder:
    limit = bounds.max_len if bounds.max_len is not None else DEFAULT_ITEMS

    def decode(value: Any, path: str, problems: dict[str, str]) -> Any:
        if not isinstance(value, list):
            problems[path] = "must be a list"
            return None
        if len(value) > limit:
            problems[path] = f"holds at most {limit} items"
            return None
        # Paths are spelled out only when something is wrong: most lists are long and right.
        scratch: dict[str, str] = {}
        items = [item(entry, "", scratch) for entry in value]
        if scratch:
            items = [item(entry, f"{path}[{index}]", problems) for index, entry in enumerate(value)]
        return tuple(items) if as_tuple else items

    return decode


def _mapping(item: Decoder, bounds: Bounds) -> Decoder:
    limit = bounds.max_len if bounds.max_len is not None else DEFAULT_ITEMS

    def decode(value: Any, path: str, problems: dict[str, str]) -> Any:
        if not isinstance(value, dict):
            problems[path] = "must be an object"
            return None
        if len(value) > limit:
            problems[path] = f"holds at most {limit} entries"
            return None
        decoded = {}
        for key, entry in value.items():
            where = f"{path}[{key!r}]"
            if not isinstance(key, str) or len(key) > DEFAULT_STR:
                problems[where] = "keys are strings"
                continue
            decoded[key] = item(entry, where, problems)
        return decoded

    return decode


def _scalar(tp: Any, bounds: Bounds) -> Decoder:
    if tp is bool:
        return _boolean
    if tp is str:
        return _string(bounds.max_len if bounds.max_len is not None else DEFAULT_STR)
    if tp is int:
        return _integer(
            int(bounds.lo) if bounds.lo is not None else 0, int(bounds.hi) if bounds.hi is not None else INT_MAX
        )
    if tp is float:
        return _number(bounds.lo, bounds.hi)
    raise TypeError(f"the protocol has no rule for {tp!r}")  # a declaration error, found by the tests


def _boolean(value: Any, path: str, problems: dict[str, str]) -> Any:
    if not isinstance(value, bool):
        problems[path] = "must be true or false"
    return value


def _string(limit: int) -> Decoder:
    def decode(value: Any, path: str, problems: dict[str, str]) -> Any:
        if not isinstance(value, str):
            problems[path] = "must be a string"
        elif len(value) > limit:
            problems[path] = f"holds at most {limit} characters"
        return value

    return decode


def _integer(lo: int, hi: int) -> Decoder:
    def decode(value: Any, path: str, problems: dict[str, str]) -> Any:
        if type(value) is not int or not lo <= value <= hi:  # a boolean is not an integer
            problems[path] = f"must be an integer in {lo}..{hi}"
        return value

    return decode


def _number(lo: float | None, hi: float | None) -> Decoder:
    message = "must be a number" + (f" in {lo:g}..{hi:g}" if lo is not None and hi is not None else "")

    def decode(value: Any, path: str, problems: dict[str, str]) -> Any:
        if type(value) not in (int, float) or not math.isfinite(value):
            problems[path] = message
            return value
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            problems[path] = message
            return value
        return float(value)

    return decode


def _json(value: Any, path: str, problems: dict[str, str], depth: int = 0) -> Any:
    """Return `value` when it is plain JSON (objects with string keys, at most 32 levels deep)."""
    if depth > 32:
        problems[path] = "is nested too deeply"
    elif isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            problems[path] = "keys are strings"
        for item in value.values():
            _json(item, path, problems, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _json(item, path, problems, depth + 1)
    elif not (value is None or isinstance(value, str | int | float | bool)):
        problems[path] = "must be JSON"
    return value
