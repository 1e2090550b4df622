"""A spec's sandbox (mounts, user, workdir, stop signal): the policy's rules, the agent's JSON, the request."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from common.protocol.messages import ReplicaSpec
from inventory.agent.executor import driver_spec
from inventory.drivers import policy, sandbox
from inventory.drivers.base import STOP_SIGNALS, Mount, RunAs, WorkloadSpec
from inventory.drivers.docker import container_config
from inventory.drivers.policy import SpecRefused
from tests.inventory.drivers.conftest import agent_spec, new_spec

HOME = Mount("/srv/gpucloud/t1/homes/alice", "/home/alice", root="/srv/gpucloud", uid=1001, gid=1001, mode=0o700)
DATA = Mount("/srv/gpucloud/t1/datasets/imagenet", "/datasets/imagenet", read_only=True, root="/srv/gpucloud")


def sandboxed(**changes: Any) -> WorkloadSpec:
    spec = new_spec(["true"], tenant="acme")
    fields: dict[str, Any] = {
        "mounts": (HOME, DATA),
        "run_as": RunAs(1001, 2001, (1001, 2000)),
        "workdir": "/home/alice",
    }
    return dataclasses.replace(spec, **(fields | changes))


def test_a_sandbox_within_the_rules_passes() -> None:
    sandbox.check_sandbox(sandboxed())
    sandbox.check_sandbox(new_spec(["true"], tenant="acme"))
    for signal in STOP_SIGNALS:
        sandbox.check_sandbox(sandboxed(stop_signal=signal))


@pytest.mark.parametrize(
    ("changes", "field", "rule"),
    [
        ({"stop_signal": "SIGKILL"}, "stop_signal", policy.RULE_INVALID_VALUE),
        ({"stop_signal": "TERM"}, "stop_signal", policy.RULE_INVALID_VALUE),
        ({"run_as": RunAs(0, 2001)}, "run_as.uid", policy.RULE_ROOT_USER),
        ({"run_as": RunAs(1001, 0)}, "run_as.gid", policy.RULE_ROOT_USER),
        ({"run_as": RunAs(1001, 2001, (5, 0))}, "run_as.groups[1]", policy.RULE_ROOT_USER),
        ({"run_as": RunAs(-1, 2001)}, "run_as.uid", policy.RULE_INVALID_VALUE),
        ({"run_as": RunAs(1001, 2001, tuple(range(1, 40)))}, "run_as.groups", policy.RULE_INVALID_VALUE),
        ({"workdir": "home/alice"}, "workdir", policy.RULE_INVALID_VALUE),
        ({"workdir": "/home/alice/../bob"}, "workdir", policy.RULE_INVALID_VALUE),
        ({"mounts": (dataclasses.replace(HOME, target="/"),)}, "mounts[0].target", policy.RULE_INVALID_VALUE),
        ({"mounts": (dataclasses.replace(HOME, target="/proc/x"),)}, "mounts[0].target", policy.RULE_INVALID_VALUE),
        ({"mounts": (dataclasses.replace(HOME, target="/a/./b"),)}, "mounts[0].target", policy.RULE_INVALID_VALUE),
        ({"mounts": (dataclasses.replace(HOME, source="/etc"),)}, "mounts[0].source", policy.RULE_HOST_PATH),
        ({"mounts": (dataclasses.replace(HOME, source="/srv/gpucloud"),)}, "mounts[0].source", policy.RULE_HOST_PATH),
        (
            {"mounts": (dataclasses.replace(HOME, source="/srv/gpucloud/../etc"),)},
            "mounts[0].source",
            policy.RULE_INVALID_VALUE,
        ),
        ({"mounts": (dataclasses.replace(HOME, root=""),)}, "mounts[0].root", policy.RULE_INVALID_VALUE),
        ({"mounts": (dataclasses.replace(HOME, gid=None),)}, "mounts[0].uid", policy.RULE_INVALID_VALUE),
        ({"mounts": (dataclasses.replace(HOME, mode=0o17777),)}, "mounts[0].mode", policy.RULE_INVALID_VALUE),
        ({"mounts": (HOME, dataclasses.replace(DATA, target="/home/alice/data"))}, "mounts", policy.RULE_INVALID_VALUE),
        ({"mounts": (HOME, dataclasses.replace(DATA, source=HOME.source + "/x"))}, "mounts", policy.RULE_INVALID_VALUE),
        ({"mounts": (HOME, dataclasses.replace(DATA, target=HOME.target))}, "mounts", policy.RULE_INVALID_VALUE),
    ],
)
def test_a_sandbox_outside_the_rules_is_refused_naming_the_field(
    changes: dict[str, Any], field: str, rule: str
) -> None:
    with pytest.raises(SpecRefused) as refused:
        sandbox.check_sandbox(sandboxed(**changes))
    assert (refused.value.field, refused.value.rule) == (field, rule)


def test_targets_that_only_share_a_prefix_are_not_nested() -> None:
    sandbox.check_sandbox(sandboxed(mounts=(HOME, dataclasses.replace(DATA, target="/home/alice-2"))))


# --- the agent's JSON ---------------------------------------------------------------------


def test_the_agent_turns_the_storage_keys_into_the_driver_spec() -> None:
    message = agent_spec("n1", 7, "acme", "busybox", ["true"])
    message |= {
        "mounts": [
            {"source": HOME.source, "target": HOME.target, "read_only": False, "root": HOME.root, "marker": ""}
            | {"uid": 1001, "gid": 1001, "mode": 0o700},
            {"source": DATA.source, "target": DATA.target, "read_only": True, "root": DATA.root, "marker": "m"},
        ],
        "run_as": {"uid": 1001, "gid": 2001, "groups": [1001, 2000]},
        "workdir": "/home/alice",
        "stop_signal": "SIGUSR1",
    }
    spec = driver_spec(ReplicaSpec.from_wire(message))
    assert spec.mounts == (HOME, dataclasses.replace(DATA, marker="m"))
    assert spec.run_as == RunAs(1001, 2001, (1001, 2000))
    assert (spec.workdir, spec.stop_signal, spec.image) == ("/home/alice", "SIGUSR1", "busybox")


def test_a_message_without_the_storage_keys_keeps_the_old_behaviour() -> None:
    spec = driver_spec(ReplicaSpec.from_wire(agent_spec("n1", 7, "acme", "busybox", ["true"]) | {"run_as": None}))
    assert (spec.mounts, spec.run_as, spec.workdir, spec.stop_signal) == ((), None, "", "SIGTERM")


# --- the container request ------------------------------------------------------------------


def test_the_container_binds_each_volume_and_runs_as_the_spec_says() -> None:
    config = container_config(sandboxed(stop_signal="SIGUSR1"), user="1000:1000", network="n")
    assert config["host_config"]["Mounts"] == [
        {"Target": "/home/alice", "Source": HOME.source, "Type": "bind", "ReadOnly": False},
        {"Target": "/datasets/imagenet", "Source": DATA.source, "Type": "bind", "ReadOnly": True},
    ]
    assert "Binds" not in config["host_config"], "only the volume directories are bound"
    assert config["host_config"]["GroupAdd"] == ["1001", "2000"]
    assert (config["user"], config["working_dir"], config["stop_signal"]) == ("1001:2001", "/home/alice", "SIGUSR1")
    assert config["environment"]["HOME"] == "/home/alice"


def test_without_a_sandbox_the_container_is_as_before() -> None:
    config = container_config(new_spec(["true"], tenant="acme"), user="1000:1000", network="n")
    assert "Mounts" not in config["host_config"] and "GroupAdd" not in config["host_config"]
    assert (config["user"], config["working_dir"], config["stop_signal"]) == ("1000:1000", None, "SIGTERM")
    assert "HOME" not in config["environment"]
