"""Node and GPU enumerations, and the node lifecycle's transition table."""

from __future__ import annotations

from django.db import models

from common.transitions import Transitions


class NodeKind(models.TextChoices):
    BARE_METAL = "bare_metal", "Bare metal"
    VM = "vm", "Virtual machine"
    CONTAINER_HOST = "container_host", "Container host"


class RuntimeKind(models.TextChoices):
    """How workloads run on a node. `process` is not isolated; `simulated` exists only in the database."""

    DOCKER = "docker", "Docker"
    PROCESS = "process", "Local process (not isolated)"
    SIMULATED = "simulated", "Simulated"


class NodeState(models.TextChoices):
    REGISTERED = "registered", "Registered"
    PROVISIONING = "provisioning", "Provisioning"
    READY = "ready", "Ready"
    CORDONED = "cordoned", "Cordoned"
    DRAINING = "draining", "Draining"
    MAINTENANCE = "maintenance", "Maintenance"
    RETIRED = "retired", "Retired"
    FAILED = "failed", "Failed"
    UNREACHABLE = "unreachable", "Unreachable"


S = NodeState

# States in which the node's agent is expected to heartbeat; losing the
# heartbeat in one of them makes the node unreachable.
LIVE_STATES: frozenset[NodeState] = frozenset({S.READY, S.CORDONED, S.DRAINING, S.MAINTENANCE})

# The lifecycle. `unreachable` returns to the state it interrupted (kept on
# the node), so it is listed as reaching every live state.
NODE_TRANSITIONS: Transitions[NodeState] = Transitions(
    "node",
    NodeState,
    {
        S.REGISTERED: frozenset({S.PROVISIONING, S.RETIRED}),
        S.PROVISIONING: frozenset({S.READY, S.FAILED}),
        S.FAILED: frozenset({S.PROVISIONING, S.RETIRED}),
        S.READY: frozenset({S.CORDONED, S.DRAINING, S.UNREACHABLE}),
        S.CORDONED: frozenset({S.READY, S.DRAINING, S.UNREACHABLE}),
        # Uncordoning a draining node cancels the drain.
        S.DRAINING: frozenset({S.MAINTENANCE, S.READY, S.UNREACHABLE}),
        # Leaving maintenance for service may re-provision first (re-probe after repairs).
        S.MAINTENANCE: frozenset({S.READY, S.RETIRED, S.PROVISIONING, S.UNREACHABLE}),
        S.UNREACHABLE: LIVE_STATES | {S.RETIRED},
        S.RETIRED: frozenset(),
    },
)

# Transitions an operator asks for must say why.
REASON_REQUIRED: frozenset[NodeState] = frozenset({S.CORDONED, S.DRAINING, S.MAINTENANCE})


class PlacementPolicy(models.TextChoices):
    """How the scheduler picks nodes in a pool: fill the fullest that fits (fewer fragments), or the emptiest."""

    BINPACK = "binpack", "Bin-packing (fill nodes first)"
    SPREAD = "spread", "Spread (emptiest node first)"


class GpuHealth(models.TextChoices):
    OK = "ok", "OK"
    DEGRADED = "degraded", "Degraded"
    FAILED = "failed", "Failed"


class MigMode(models.TextChoices):
    DISABLED = "disabled", "Disabled"
    ENABLED = "enabled", "Enabled"
    UNSUPPORTED = "unsupported", "Not supported"


class StorageKind(models.TextChoices):
    """Where a storage backend's root lives: on one node's disk, or on a filesystem every host mounts."""

    LOCAL = "local", "Node-local directory"
    SHARED = "shared", "Shared filesystem"


class VolumeKind(models.TextChoices):
    """A personal home, a project's shared volume, or a dataset (mounted read-only into workloads)."""

    HOME = "home", "Home"
    PROJECT = "project", "Project volume"
    DATASET = "dataset", "Dataset"


class FileKind(models.TextChoices):
    """What an entry of a volume's folder is (a link is shown, never followed)."""

    FILE = "file", "File"
    DIR = "dir", "Folder"
    LINK = "link", "Link"
