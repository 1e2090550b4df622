"""What a user may ask of a container, and the names and labels every runtime uses.

Pure: no Django, no SDK. Two gates:

- `check_container_request` runs when a workload is submitted (API, UI or
  CLI) and refuses any key outside a small whitelist, naming the field and
  the rule, so a user cannot widen their access (privileged mode, host
  paths, host namespaces, devices, root).
- `check_environment` (with `check_service_port`, and `sandbox.check_sandbox`) run
  again inside every runtime's `start`, before anything reaches the engine,
  so a spec built by any other path is held to the same rules.

`SpecRefused.rule` is one of the `RULE_*` codes below; `field` is the
submitted key (`privileged`, `env.LD_PRELOAD`, `command[2]`, ...).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from inventory.drivers.base import PermanentDriverError

LABEL_WORKLOAD = "gpucloud.workload"
LABEL_TENANT = "gpucloud.tenant"
LABEL_ATTEMPT = "gpucloud.attempt"
LABEL_REPLICA = "gpucloud.replica"
LABEL_MANAGED = "gpucloud.managed"
LABEL_PURPOSE = "gpucloud.purpose"
# Whose a container is: the console installation that started it and the node it was started for. Reconcile
# touches only containers carrying its own pair; one without them (started before the labels existed) is left alone.
LABEL_INSTALLATION = "gpucloud.installation"
LABEL_NODE = "gpucloud.node"
MANAGED = "1"
RESERVED_LABEL_PREFIX = "gpucloud."

RULE_FORBIDDEN_OVERRIDE = "forbidden_override"
RULE_HOST_PATH = "host_path"
RULE_HOST_NAMESPACE = "host_namespace"
RULE_ROOT_USER = "root_user"
RULE_UNKNOWN_FIELD = "unknown_field"
RULE_INVALID_VALUE = "invalid_value"
RULE_FORBIDDEN_ENV = "forbidden_env"
RULE_INVALID_ENV_NAME = "invalid_env_name"
RULE_INVALID_ENV_VALUE = "invalid_env_value"
RULE_ENV_TOO_LARGE = "env_too_large"
RULE_RESERVED_LABEL = "reserved_label"

ALLOWED_FIELDS = frozenset({"image", "command", "env", "gpus", "cpu_milli", "memory_mib", "replicas", "labels"})
"""The container keys a submission may carry; everything else is the platform's to decide."""

# Keys that would change isolation, compared after normalisation (lower case,
# no `_` or `-`), so `cap_add`, `CapAdd` and `cap-add` are all caught.
_HOST_PATH_FIELDS = frozenset({"volumes", "volumesfrom", "binds", "mounts", "devices"})
_NAMESPACE_FIELDS = frozenset({"networkmode", "network", "pidmode", "pid", "ipcmode", "ipc", "utsmode", "usernsmode"})
_FORBIDDEN_FIELDS = frozenset(
    {
        "privileged",
        "capadd",
        "capabilities",
        "capdrop",
        "devicerequests",
        "devicecgrouprules",
        "securityopt",
        "runtime",
        "sysctls",
        "ulimits",
        "cgroupparent",
        "cgroupns",
        "cgroupnsmode",
        "groupadd",
        "hostconfig",
        "oomkilldisable",
        "pidslimit",
        "memswaplimit",
        "shmsize",
        "storageopt",
        "extrahosts",
        "networks",
        "ports",
        "publishallports",
        "readonly",
        "init",
        "entrypoint",
        "hostname",
        "tmpfs",
    }
)
_ROOT_USERS = frozenset({"0", "root"})

# Names that choose GPUs, inject code into every process, or talk to the engine.
_FORBIDDEN_ENV_NAMES = frozenset(
    {"CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"}
)
_FORBIDDEN_ENV_PREFIXES = ("NVIDIA_", "DOCKER_", "LD_")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
MAX_ENV_VARS = 256
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_ENV_TOTAL_BYTES = 256 * 1024
MAX_COMMAND_ITEMS = 1024
MAX_COMMAND_BYTES = 128 * 1024
MAX_PORT = 65535

_DOCKER_NAME_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


class SpecRefused(PermanentDriverError):
    """A submitted container key or value is not allowed; `field` names it, `rule` says why."""

    code = "spec_refused"

    def __init__(self, field: str, rule: str, detail: str = "") -> None:
        self.field = field
        self.rule = rule
        suffix = f": {detail}" if detail else ""
        super().__init__(f"{field} refused ({rule}){suffix}")


def check_environment(env: Mapping[str, str]) -> None:
    """Return None when every variable of `env` may be set in a workload; raise SpecRefused otherwise.

    Refused: names that choose GPUs or drivers (`NVIDIA_*`,
    `CUDA_VISIBLE_DEVICES`, ...), that inject code (`LD_*`) or that talk to
    the engine (`DOCKER_*`); names that are not shell identifiers; values
    with NUL; more than MAX_ENV_VARS variables or oversized values. `field`
    is `env.NAME` (or `env` for the size of the whole set).
    """
    if not isinstance(env, Mapping):
        raise SpecRefused("env", RULE_INVALID_VALUE, "must be an object of strings")
    if len(env) > MAX_ENV_VARS:
        raise SpecRefused("env", RULE_ENV_TOO_LARGE, f"at most {MAX_ENV_VARS} variables")
    total = 0
    for name, value in env.items():
        _check_env_name(name)
        field = f"env.{name}"
        if not isinstance(value, str):
            raise SpecRefused(field, RULE_INVALID_ENV_VALUE, "must be a string")
        if "\0" in value:
            raise SpecRefused(field, RULE_INVALID_ENV_VALUE, "contains a NUL character")
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_ENV_VALUE_BYTES:
            raise SpecRefused(field, RULE_ENV_TOO_LARGE, f"value over {MAX_ENV_VALUE_BYTES} bytes")
        total += size + len(name) + 2
    if total > MAX_ENV_TOTAL_BYTES:
        raise SpecRefused("env", RULE_ENV_TOO_LARGE, f"over {MAX_ENV_TOTAL_BYTES} bytes in all")


def _check_env_name(name: object) -> None:
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        raise SpecRefused(f"env.{name}", RULE_INVALID_ENV_NAME, "must match [A-Za-z_][A-Za-z0-9_]*")
    upper = name.upper()
    if upper in _FORBIDDEN_ENV_NAMES or upper.startswith(_FORBIDDEN_ENV_PREFIXES):
        raise SpecRefused(f"env.{name}", RULE_FORBIDDEN_ENV, "set by the platform, not by workloads")


def check_service_port(port: int | None, env_name: str) -> None:
    """Return None when a spec's service port and its variable are acceptable; raise SpecRefused otherwise.

    `port` is None or a TCP port in [1, 65535] (`service_port`,
    `invalid_value`); `env_name`, when given, needs a port and must be a
    name `check_environment` accepts (`service_port_env`, with that rule).
    The runtime, not the user, publishes the port: `check_container_request`
    keeps refusing `ports` and `publish_all_ports`.
    """
    if port is None:
        if env_name:
            raise SpecRefused("service_port_env", RULE_INVALID_VALUE, "is set but there is no service_port")
        return
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= MAX_PORT:
        raise SpecRefused("service_port", RULE_INVALID_VALUE, f"must be an integer in [1, {MAX_PORT}]")
    if env_name:
        try:
            _check_env_name(env_name)
        except SpecRefused as refused:
            raise SpecRefused("service_port_env", refused.rule, str(refused).partition(": ")[2]) from refused


def check_container_request(request: Mapping[str, Any], *, also_allowed: Collection[str] = ()) -> None:
    """Return None when the container part of a submission is acceptable; raise SpecRefused otherwise.

    `request` may carry only the keys in ALLOWED_FIELDS (`image`, `command`,
    `env`, `gpus`, `cpu_milli`, `memory_mib`, `replicas`, `labels`) plus the
    caller's own non-container keys named in `also_allowed` (e.g. `project`,
    `pool`), which the caller validates itself. Every attempt to choose
    isolation is refused with the key as `field`: host paths (`volumes`,
    `binds`, `mounts`, `devices`: rule `host_path`), namespaces
    (`network_mode`, `pid_mode`, `ipc_mode`, ...: `host_namespace` when
    the value is `host`, else `forbidden_override`), `privileged`,
    `cap_add`, `security_opt`, `runtime` and the like
    (`forbidden_override`), `user` (`root_user` for root, else
    `forbidden_override`: the runtime picks the user), any other key
    (`unknown_field`). Values are type-checked (`invalid_value`), `env`
    goes through `check_environment`, labels may not use the reserved
    `gpucloud.` prefix (`reserved_label`).
    """
    if not isinstance(request, Mapping):
        raise SpecRefused("request", RULE_INVALID_VALUE, "must be an object")
    for key, value in request.items():
        if key in ALLOWED_FIELDS or key in also_allowed:
            continue
        _refuse_override(str(key), value)
    _check_values(request)


def _refuse_override(key: str, value: Any) -> None:
    normal = key.replace("_", "").replace("-", "").lower()
    if normal == "user":
        rule = RULE_ROOT_USER if _is_root(value) else RULE_FORBIDDEN_OVERRIDE
        raise SpecRefused(key, rule, "workloads run as the platform's unprivileged user")
    if normal in _HOST_PATH_FIELDS:
        raise SpecRefused(key, RULE_HOST_PATH, "host paths and devices cannot be mounted")
    if normal in _NAMESPACE_FIELDS:
        rule = RULE_HOST_NAMESPACE if str(value).lower() == "host" else RULE_FORBIDDEN_OVERRIDE
        raise SpecRefused(key, rule, "namespaces are chosen by the platform")
    if normal in _FORBIDDEN_FIELDS:
        raise SpecRefused(key, RULE_FORBIDDEN_OVERRIDE, "isolation settings are chosen by the platform")
    raise SpecRefused(key, RULE_UNKNOWN_FIELD, f"allowed: {', '.join(sorted(ALLOWED_FIELDS))}")


def _is_root(value: Any) -> bool:
    parts = str(value).strip().lower().split(":")
    return any(part in _ROOT_USERS for part in parts) or parts == [""]


def _check_values(request: Mapping[str, Any]) -> None:
    image = request.get("image")
    if "image" in request and (not isinstance(image, str) or not image.strip() or "\0" in image):
        raise SpecRefused("image", RULE_INVALID_VALUE, "must be a non-empty image reference")
    if "command" in request:
        _check_command(request["command"])
    if "env" in request:
        check_environment(request["env"])
    for field, minimum in (("gpus", 0), ("replicas", 1), ("memory_mib", 1), ("cpu_milli", 1)):
        if field in request:
            _check_int(field, request[field], minimum)
    if "labels" in request:
        _check_labels(request["labels"])


def _check_command(command: Any) -> None:
    if not isinstance(command, list) or len(command) > MAX_COMMAND_ITEMS:
        raise SpecRefused("command", RULE_INVALID_VALUE, f"must be a list of at most {MAX_COMMAND_ITEMS} strings")
    for index, part in enumerate(command):
        if not isinstance(part, str) or "\0" in part:
            raise SpecRefused(f"command[{index}]", RULE_INVALID_VALUE, "must be a string without NUL")
    if sum(len(part.encode("utf-8", "surrogatepass")) for part in command) > MAX_COMMAND_BYTES:
        raise SpecRefused("command", RULE_INVALID_VALUE, f"over {MAX_COMMAND_BYTES} bytes")


def _check_int(field: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecRefused(field, RULE_INVALID_VALUE, f"must be an integer >= {minimum}")


def _check_labels(labels: Any) -> None:
    if not isinstance(labels, Mapping):
        raise SpecRefused("labels", RULE_INVALID_VALUE, "must be an object of strings")
    for key, value in labels.items():
        field = f"labels.{key}"
        if not isinstance(key, str) or not isinstance(value, str) or "\0" in key + value:
            raise SpecRefused(field, RULE_INVALID_VALUE, "keys and values must be strings without NUL")
        if key.startswith(RESERVED_LABEL_PREFIX):
            raise SpecRefused(field, RULE_RESERVED_LABEL, f"the {RESERVED_LABEL_PREFIX} prefix is the platform's")


# --- names and labels -------------------------------------------------------------


INSTALLATION_TAG_LENGTH = 8
_INSTALLATION = re.compile(rf"[0-9a-f]{{{INSTALLATION_TAG_LENGTH},}}")


def installation_tag(installation: str) -> str:
    """Return the short form of an installation id that every Docker object name of that console holds.

    Two consoles sharing one engine would otherwise both name their first
    workload `...-w1-...` and their tenant `acme`'s bridge alike: the
    second start would fail on the name, or worse, share the first's
    network. Its first 8 hex digits (`inventory.services.installation`
    gives 16): a collision needs two consoles out of 4 billion ids on one
    engine. Raises PermanentDriverError (`invalid_name`) unless
    `installation` is at least that many lowercase hex digits (an empty
    one included: an unnamed console cannot name what it makes).
    """
    if not _INSTALLATION.fullmatch(installation):
        raise PermanentDriverError(f"cannot name an object after installation {installation!r}", code="invalid_name")
    return installation[:INSTALLATION_TAG_LENGTH]


def container_name(installation: str, workload_id: str | int, replica: int, attempt: int) -> str:
    """Return the deterministic name of one replica of one attempt: `gpucloud-<tag>-w<id>-r<replica>-a<attempt>`.

    `<tag>` is `installation_tag(installation)`. The same inputs always give
    the same name, so a retried start adopts what an earlier try created.
    The controller names every replica with this (its row and its start
    message); the agent takes the name it is sent. Raises
    PermanentDriverError (`invalid_name`) when `workload_id` has characters
    a container name cannot hold, or as `installation_tag` does.
    """
    workload = str(workload_id)
    if not _DOCKER_NAME_PART.fullmatch(workload) or replica < 0 or attempt < 0:
        raise PermanentDriverError(f"cannot name a container after workload {workload!r}", code="invalid_name")
    return f"gpucloud-{installation_tag(installation)}-w{workload}-r{replica}-a{attempt}"


def tenant_network_name(installation: str, tenant: str) -> str:
    """Return the bridge network the containers of `tenant` of one console share: `gpucloud-<tag>-tenant-<tenant>`.

    The installation's tag keeps tenant `acme` of one console off the
    bridge of tenant `acme` of another on the same engine. Raises
    PermanentDriverError (`invalid_name`) as `installation_tag` does, or
    when `tenant` cannot be part of a name.
    """
    if not _DOCKER_NAME_PART.fullmatch(tenant):
        raise PermanentDriverError(f"cannot name a network after tenant {tenant!r}", code="invalid_name")
    return f"gpucloud-{installation_tag(installation)}-tenant-{tenant}"


GANG_NETWORK_PREFIX = "gpucloud-gang-"
GANG_PURPOSE = "gang"


def gang_network_name(installation: str, workload_id: str, attempt: int) -> str:
    """Return the overlay network of one attempt of a gang spread over hosts: `gpucloud-gang-<tag>-w<id>-a<attempt>`.

    One per gang and attempt: nothing else joins it, not even the tenant's
    other workloads. It starts with `GANG_NETWORK_PREFIX` (how a stopped
    container's gang network is told from a bridge). Raises
    PermanentDriverError (`invalid_name`) as `container_name` does.
    """
    workload = str(workload_id)
    if not _DOCKER_NAME_PART.fullmatch(workload) or attempt < 0:
        raise PermanentDriverError(f"cannot name a network after workload {workload!r}", code="invalid_name")
    return f"{GANG_NETWORK_PREFIX}{installation_tag(installation)}-w{workload}-a{attempt}"


def check_workload_name(name: str) -> None:
    """Raise PermanentDriverError (`invalid_name`) unless `name` can name a container and a directory."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}", name):
        raise PermanentDriverError(f"invalid workload name {name!r}", code="invalid_name")


def managed_labels(
    workload_id: str, tenant: str, attempt: int, replica: int, *, installation: str = "", node: str = ""
) -> dict[str, str]:
    """Return the labels that mark a workload as gpucloud's and say whose attempt and replica it is.

    `installation` and `node` (when given) say which console and which of its nodes own it.
    """
    labels = {
        LABEL_MANAGED: MANAGED,
        LABEL_WORKLOAD: str(workload_id),
        LABEL_TENANT: tenant,
        LABEL_ATTEMPT: str(attempt),
        LABEL_REPLICA: str(replica),
    }
    return labels | owner_labels(installation, node)


def owner_labels(installation: str, node: str) -> dict[str, str]:
    """Return the installation and node labels for the non-empty ones of `installation` and `node`."""
    pairs = ((LABEL_INSTALLATION, installation), (LABEL_NODE, node))
    return {key: value for key, value in pairs if value}


def identity_matches(labels: Mapping[str, str], expected: Mapping[str, str]) -> bool:
    """Return True when `labels` carry every managed label of `expected` with the same value.

    An owner label (`LABEL_INSTALLATION`, `LABEL_NODE`) absent from
    `labels` is not held against it: a container started before those
    labels existed is still adopted by its own retried start.
    """
    owner = (LABEL_INSTALLATION, LABEL_NODE)
    return all(labels.get(key) == value or (key in owner and key not in labels) for key, value in expected.items())
