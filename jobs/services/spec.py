"""What one workload asks for, normalised, and the checks that need no database.

`parse` turns the input of the API, the UI or the CLI into a spec's fields:
a `preset` in the input fills every field the input leaves out from that
launch preset, a `command` given as one line is split as a shell would
(`split_command`), and every field is held to its rule. It returns the
errors naming every failing field at once, each with a rule code, so that
an interface's own parsing errors and these are reported together
(`jobs.services.submission.submission_errors`, with the database's rules).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import shlex
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from django.core.exceptions import ValidationError

from common.errors import FieldErrors, add_errors, invalid
from common.protocol.messages import RESOURCE_FIELDS
from inventory.drivers.policy import SpecRefused, check_container_request
from inventory.models import NodePool
from jobs.choices import PriorityClass, WorkloadKind
from jobs.models import MAX_GPUS_PER_REPLICA, MAX_REPLICAS, LaunchPreset
from jobs.services.registries import check_registry

NAME_RULE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
# A Docker image reference: [registry[:port]/]path[:tag][@sha256:digest], lower case as the engine requires.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_RULE = re.compile(
    rf"(?:[a-z0-9]+(?:[.-][a-z0-9]+)*(?::[0-9]{{1,5}})?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?"
)
MAX_IMAGE_LENGTH = 255
MAX_GPU_MODELS = 16
# Ranges beyond these are typos, not plans.
_INT_RANGES: dict[str, tuple[int, int]] = {
    "gpus_per_replica": (0, MAX_GPUS_PER_REPLICA),
    "replicas": (1, MAX_REPLICAS),
    "cpu_milli": (1, 1_024_000),
    "memory_mib": (1, 16 * 1024 * 1024),
    "shm_mib": (1, 16 * 1024 * 1024),  # and at most the workload's memory_mib (`check_shm`)
    "requeue_limit": (0, 100),
    "max_runtime_seconds": (60, 365 * 24 * 3600),
}
IDLE_TIMEOUT_RANGE = (60, 365 * 24 * 3600)
_REQUIRED = ("name", "image", "pool")
# Fields a preset fills in; the rest (name, env, ...) are the submitter's own.
FILLED_BY_PRESET = (
    "kind",
    "image",
    "command",
    "pool",
    "gpus_per_replica",
    "replicas",
    *RESOURCE_FIELDS,
    "max_runtime_seconds",
)
# Set only through a preset (a tenant admin's choice), never by the submitter directly.
_NOT_INPUT = frozenset({"idle_timeout_seconds"})


@dataclass(frozen=True)
class WorkloadSpec:
    """One workload as submitted: a gang of `replicas` replicas of `gpus_per_replica` GPUs in `pool`.

    `gpu_models` empty means any model; `max_runtime_seconds` None means the
    quota's maximum; `shm_mib` (the size of /dev/shm, at most `memory_mib`)
    None means the runtime's default (Docker's 64 MiB). `preset` is the
    launch preset it came from, whose idle timeout a notebook keeps.
    """

    name: str
    image: str
    pool: NodePool
    kind: str = WorkloadKind.JOB
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    gpus_per_replica: int = 1
    replicas: int = 1
    gpu_models: list[str] = field(default_factory=list)
    cpu_milli: int = 1000
    memory_mib: int = 4096
    shm_mib: int | None = None
    priority_class: str = PriorityClass.NORMAL
    max_runtime_seconds: int | None = None
    requeue_limit: int = 3
    # The signal a stop (cancel, preemption, reclaim) sends first, so the workload can checkpoint within
    # its pool's grace period before SIGKILL.
    stop_signal: str = "SIGTERM"
    preset: LaunchPreset | None = None
    idle_timeout_seconds: int | None = None

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_replica * self.replicas

    def normalized(self) -> dict[str, Any]:
        """Return the spec as JSON-ready data (pool and preset by id, GPU models sorted and unique)."""
        # Field by field rather than dataclasses.asdict, which deep-copies the model instances of every item.
        data = {name: getattr(self, name) for name in _FIELD_NAMES}
        data["pool"] = self.pool.pk
        data["gpu_models"] = sorted(set(self.gpu_models))
        # Left out when unset, so a request without a preset keeps the digest it always had.
        for name in ("preset", "idle_timeout_seconds", "shm_mib"):
            if data[name] is None:
                del data[name]
        if self.preset is not None:
            data["preset"] = self.preset.pk
        return data


_FIELD_NAMES = tuple(f.name for f in fields(WorkloadSpec))
_DEFAULT_MEMORY_MIB: int = WorkloadSpec.memory_mib  # a dataclass field's default is its class attribute
_INPUT_FIELDS = frozenset(_FIELD_NAMES) - _NOT_INPUT
_NULLABLE = frozenset({"max_runtime_seconds", "preset", "idle_timeout_seconds", "shm_mib"})


def _with_preset(data: Mapping[str, Any]) -> dict[str, Any]:
    """Return `data` over its preset's fields (explicit input wins); the preset's idle timeout rides along."""
    preset = data.get("preset")
    if preset is None:
        return dict(data)
    if not isinstance(preset, LaunchPreset):
        raise invalid("preset", "invalid", "Must be a launch preset.")
    defaults: dict[str, Any] = {name: getattr(preset, name) for name in FILLED_BY_PRESET}
    defaults["command"] = list(preset.command)
    merged = {**defaults, **data}
    # The idle timeout is a notebook's; a preset's notebook launched as a batch job leaves it behind.
    if merged.get("kind") == WorkloadKind.NOTEBOOK:
        merged["idle_timeout_seconds"] = preset.idle_timeout_seconds
    return merged


def fingerprint(project_id: int, specs: Sequence[WorkloadSpec]) -> str:
    """Return a SHA-256 hex digest of the normalised request, to tell a retry from a different request."""
    body = json.dumps({"project": project_id, "items": [s.normalized() for s in specs]}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


def field_of(path: str) -> str:
    """Return the field an error path is about: `env.HOME` -> `env`, `command[2]` -> `command`."""
    return _FIELD_PART.split(path, maxsplit=1)[0]


_FIELD_PART = re.compile(r"[.\[]")


def parse(data: Mapping[str, Any], *, refused: Collection[str] = ()) -> tuple[dict[str, Any], FieldErrors]:
    """Return `data` over its preset's fields (a command line split, nulls left out), and every rule it breaks.

    The values are as `WorkloadSpec` takes them wherever no rule is broken.
    The errors, by field: unknown keys, missing required fields, and each
    field's rule. Fields named in `refused` are those an interface could not
    even parse (a non-integer, a name too long for its field): they are
    neither required nor checked here, so the interface's errors and these
    together name every failing field once, each with one rule.
    """
    errors: FieldErrors = {}
    for key in data:
        if key not in _INPUT_FIELDS:
            message = f"Unknown field; allowed: {', '.join(sorted(_INPUT_FIELDS))}."
            errors[str(key)] = [ValidationError(message, code="unknown_field")]
    try:
        merged = _with_preset(data)
    except ValidationError as error:
        add_errors(errors, error)
        merged = {key: value for key, value in data.items() if key != "preset"}
    if isinstance(merged.get("command"), str):
        try:
            merged["command"] = split_command(merged["command"])
        except ValidationError as error:
            add_errors(errors, error)
            del merged["command"]
    # A null stands for the field's default, as if left out; only the nullable fields keep theirs.
    merged = {key: value for key, value in merged.items() if value is not None or key in _NULLABLE}
    for key in _REQUIRED:
        if key not in refused and merged.get(key) in (None, ""):
            errors[key] = [ValidationError("This field is required.", code="required")]
    if "pool" not in errors and "pool" not in refused and not isinstance(merged.get("pool"), NodePool):
        errors["pool"] = [ValidationError("Must be a node pool.", code="invalid")]
    for name, messages in rule_errors(merged, skip={*refused, *errors}).items():
        errors.setdefault(name, []).extend(messages)
    return merged, errors


def split_command(line: str) -> list[str]:
    """Return `line` split into arguments as a POSIX shell would (quotes group, backslashes escape).

    The one reading of a command typed as a line, on the launch page and in
    the API alike. Raises ValidationError on `command` (rule `invalid`) for
    a line a shell could not split (an unclosed quote).
    """
    try:
        return shlex.split(line)
    except ValueError as error:
        raise invalid("command", "invalid", f"Cannot split the command: {error}.") from None


def rule_errors(values: Mapping[str, Any], *, skip: Collection[str] = ()) -> FieldErrors:
    """Return the rule each field of `values` breaks, by field (no database); fields in `skip` are left alone.

    Every field is checked whatever the others hold, so one call names every
    failing field. A field absent from `values` takes its default, which
    follows its rule.
    """
    errors: FieldErrors = {}
    # A skipped field reads as None to the rules of the others (shm_mib's bound is the memory), never as its default.
    seen = {**values, **dict.fromkeys(skip)} if skip else values
    for name, value in values.items():
        rule = _RULES.get(name)
        # The idle timeout's rule depends on the kind: judged only once the kind could be read.
        if rule is None or name in skip or (name == "idle_timeout_seconds" and "kind" in skip):
            continue
        try:
            rule(value, seen)
        except ValidationError as error:
            add_errors(errors, error)
    return errors


def check_name(name: Any) -> None:
    """Raise ValidationError on `name` (rule `invalid_name`) unless it is a workload name."""
    if not isinstance(name, str) or not NAME_RULE.fullmatch(name):
        raise invalid(
            "name",
            "invalid_name",
            "Use 1 to 63 lowercase letters, digits or hyphens, starting and ending with a letter or digit.",
        )


# Signals a workload may ask to be stopped with (the runtimes' allow-list).
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT")
# Django builds an enum's `values` list anew on every access; these are read for every item submitted.
_KINDS = tuple(WorkloadKind.values)
_PRIORITY_CLASSES = tuple(PriorityClass.values)


def _check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise invalid(name, "invalid_choice", f"Must be one of: {', '.join(allowed)}.")


def check_kind(kind: Any) -> None:
    """Raise ValidationError on `kind` (rule `invalid_choice`) unless it is a workload kind."""
    _check_choice("kind", kind, _KINDS)


def check_idle_timeout(seconds: Any, kind: str) -> None:
    """Raise ValidationError on `idle_timeout_seconds` unless it is empty, or a notebook's and in range."""
    if seconds is None:
        return
    if kind != WorkloadKind.NOTEBOOK:
        raise invalid("idle_timeout_seconds", "notebooks_only", "Only notebooks have an idle timeout.")
    low, high = IDLE_TIMEOUT_RANGE
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise invalid("idle_timeout_seconds", "invalid", "Must be a whole number.")
    if not low <= seconds <= high:
        raise invalid("idle_timeout_seconds", "out_of_range", f"Must be between {low} and {high}.")


def check_image(image: Any) -> None:
    """Raise ValidationError on `image` (rule `invalid_image`) unless it is an image reference."""
    if not isinstance(image, str) or len(image) > MAX_IMAGE_LENGTH or not IMAGE_RULE.fullmatch(image):
        raise invalid(
            "image",
            "invalid_image",
            "Must be an image reference such as registry.example.com/team/train:1.0 "
            "(lower case, at most 255 characters).",
        )


def check_container_part(name: str, value: Any) -> None:
    """Raise ValidationError naming the field (`command[2]`, `env.HOME`) when a runtime would refuse it."""
    # The same gate every runtime applies before starting a container: a spec
    # refused there must be refused here, at submission, naming the same field.
    # One key at a time, so a refused command does not hide a refused environment.
    try:
        check_container_request({name: value})
    except SpecRefused as refused:
        raise invalid(refused.field, refused.rule, str(refused)) from None


def check_int(name: str, value: Any) -> None:
    """Raise ValidationError on `name` unless `value` is a whole number in the field's range."""
    if value is None and name in _NULLABLE:
        return
    low, high = _INT_RANGES[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(name, "invalid", "Must be a whole number.")
    if not low <= value <= high:
        raise invalid(name, "out_of_range", f"Must be between {low} and {high}.")


def check_shm(shm_mib: Any, memory_mib: Any) -> None:
    """Raise ValidationError on `shm_mib` unless it is None, or a whole number in range and at most `memory_mib`.

    /dev/shm is memory the workload holds, so it cannot exceed its memory
    (rule `over_memory`). Compared only with a `memory_mib` that meets its own rule.
    """
    check_int("shm_mib", shm_mib)
    low, high = _INT_RANGES["memory_mib"]
    memory_read = isinstance(memory_mib, int) and not isinstance(memory_mib, bool) and low <= memory_mib <= high
    if shm_mib is not None and memory_read and shm_mib > memory_mib:
        raise invalid("shm_mib", "over_memory", f"Must be at most memory_mib ({memory_mib} MiB).")


def check_gpu_models(models: Any) -> None:
    """Raise ValidationError on `gpu_models` unless it is a short list of GPU model names."""
    if not isinstance(models, list) or len(models) > MAX_GPU_MODELS:
        raise invalid("gpu_models", "invalid", f"Must be a list of at most {MAX_GPU_MODELS} GPU model names.")
    if any(not isinstance(m, str) or not m.strip() for m in models):
        raise invalid("gpu_models", "invalid", "GPU model names must be non-empty strings.")


def _check_int_rule(name: str, value: Any, values: Mapping[str, Any]) -> None:
    check_int(name, value)


def _check_image_rule(image: Any, values: Mapping[str, Any]) -> None:
    check_image(image)
    check_container_part("image", image)  # after the stricter rule above: the runtime's own gate as well
    check_registry(image)  # never a pull from the node's own loopback or a metadata service, unless allowed


# The rule of each field of a spec: (the value, all the values) -> None, or ValidationError naming the field.
_RULES: dict[str, Callable[[Any, Mapping[str, Any]], None]] = {
    "kind": lambda value, _: check_kind(value),
    "priority_class": lambda value, _: _check_choice("priority_class", value, _PRIORITY_CLASSES),
    "stop_signal": lambda value, _: _check_choice("stop_signal", value, STOP_SIGNALS),
    "name": lambda value, _: check_name(value),
    "image": _check_image_rule,
    "command": lambda value, _: check_container_part("command", value),
    "env": lambda value, _: check_container_part("env", value),
    **{name: functools.partial(_check_int_rule, name) for name in _INT_RANGES},
    "shm_mib": lambda value, values: check_shm(value, values.get("memory_mib", _DEFAULT_MEMORY_MIB)),
    "gpu_models": lambda value, _: check_gpu_models(value),
    "idle_timeout_seconds": lambda value, values: check_idle_timeout(value, values.get("kind", WorkloadKind.JOB)),
}


def prefixed(error: ValidationError, prefix: str) -> ValidationError:
    """Return `error` with every field name prefixed (`items[3].image`), for errors of one item of many."""
    if not hasattr(error, "error_dict"):
        return ValidationError({prefix.rstrip("."): error.error_list})
    return ValidationError({f"{prefix}{name}": errors for name, errors in error.error_dict.items()})
