"""What a submission may ask of a container, and the names and labels every runtime uses."""

from __future__ import annotations

import re
from typing import Any

import pytest

from inventory.drivers import policy
from inventory.drivers.base import PermanentDriverError
from inventory.drivers.policy import SpecRefused, check_container_request, check_environment

VALID = {
    "image": "ghcr.io/acme/train:1.2",
    "command": ["python", "train.py", "--epochs", "3"],
    "env": {"EPOCHS": "3", "WANDB_MODE": "offline", "_private": ""},
    "gpus": 2,
    "cpu_milli": 7500,
    "memory_mib": 65536,
    "replicas": 1,
    "labels": {"team": "vision"},
}


def refused(request: dict[str, Any]) -> SpecRefused:
    with pytest.raises(SpecRefused) as caught:
        check_container_request(request)
    return caught.value


def test_a_plain_request_passes() -> None:
    check_container_request(VALID)


@pytest.mark.parametrize(
    ("override", "field", "rule"),
    [
        ({"privileged": True}, "privileged", "forbidden_override"),
        ({"cap_add": ["SYS_ADMIN"]}, "cap_add", "forbidden_override"),
        ({"CapAdd": ["NET_ADMIN"]}, "CapAdd", "forbidden_override"),
        ({"capabilities": ["ALL"]}, "capabilities", "forbidden_override"),
        ({"devices": ["/dev/nvidia0:/dev/nvidia0"]}, "devices", "host_path"),
        ({"volumes": ["/:/host"]}, "volumes", "host_path"),
        ({"binds": {"/etc": {"bind": "/etc"}}}, "binds", "host_path"),
        ({"mounts": [{"source": "/var/run/docker.sock"}]}, "mounts", "host_path"),
        ({"network_mode": "host"}, "network_mode", "host_namespace"),
        ({"network_mode": "container:abc"}, "network_mode", "forbidden_override"),
        ({"pid_mode": "host"}, "pid_mode", "host_namespace"),
        ({"ipc_mode": "host"}, "ipc_mode", "host_namespace"),
        ({"userns_mode": "host"}, "userns_mode", "host_namespace"),
        ({"user": 0}, "user", "root_user"),
        ({"user": "root"}, "user", "root_user"),
        ({"user": "0:0"}, "user", "root_user"),
        ({"user": "1000:1000"}, "user", "forbidden_override"),
        ({"security_opt": ["seccomp=unconfined"]}, "security_opt", "forbidden_override"),
        ({"runtime": "nvidia"}, "runtime", "forbidden_override"),
        ({"sysctls": {"kernel.shm_rmid_forced": "1"}}, "sysctls", "forbidden_override"),
        ({"device_requests": [{"count": -1}]}, "device_requests", "forbidden_override"),
        ({"host_config": {"Privileged": True}}, "host_config", "forbidden_override"),
        ({"entrypoint": ["/bin/sh"]}, "entrypoint", "forbidden_override"),
        ({"shm_size": "64g"}, "shm_size", "forbidden_override"),
        ({"flavour": "extra"}, "flavour", "unknown_field"),
    ],
)
def test_every_attempt_to_choose_isolation_is_refused_naming_field_and_rule(
    override: dict[str, Any], field: str, rule: str
) -> None:
    error = refused({**VALID, **override})
    assert (error.field, error.rule, error.code) == (field, rule, "spec_refused")
    assert field in str(error) and rule in str(error)
    assert isinstance(error, PermanentDriverError)


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("NVIDIA_VISIBLE_DEVICES", "forbidden_env"),
        ("NVIDIA_DRIVER_CAPABILITIES", "forbidden_env"),
        ("nvidia_visible_devices", "forbidden_env"),
        ("CUDA_VISIBLE_DEVICES", "forbidden_env"),
        ("GPU_DEVICE_ORDINAL", "forbidden_env"),
        ("HIP_VISIBLE_DEVICES", "forbidden_env"),
        ("ROCR_VISIBLE_DEVICES", "forbidden_env"),
        ("LD_PRELOAD", "forbidden_env"),
        ("LD_LIBRARY_PATH", "forbidden_env"),
        ("LD_AUDIT", "forbidden_env"),
        ("DOCKER_HOST", "forbidden_env"),
        ("1ST", "invalid_env_name"),
        ("A-B", "invalid_env_name"),
        ("A=B", "invalid_env_name"),
        ("", "invalid_env_name"),
    ],
)
def test_environment_names_that_widen_access_or_are_not_names_are_refused(name: str, rule: str) -> None:
    for check in (check_environment, lambda env: check_container_request({"env": env})):
        with pytest.raises(SpecRefused) as caught:
            check({name: "x"})
        assert (caught.value.field, caught.value.rule) == (f"env.{name}", rule)


def test_environment_values_with_nul_or_absurd_sizes_are_refused() -> None:
    cases = [
        ({"A": "x\0y"}, "env.A", "invalid_env_value"),
        ({"A": 3}, "env.A", "invalid_env_value"),
        ({"A": "x" * (policy.MAX_ENV_VALUE_BYTES + 1)}, "env.A", "env_too_large"),
        ({f"V{i}": "x" for i in range(policy.MAX_ENV_VARS + 1)}, "env", "env_too_large"),
        ({f"V{i}": "x" * 30000 for i in range(10)}, "env", "env_too_large"),
    ]
    for env, field, rule in cases:
        with pytest.raises(SpecRefused) as caught:
            check_environment(env)  # type: ignore[arg-type]  # a wrong type on purpose
        assert (caught.value.field, caught.value.rule) == (field, rule)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"image": ""}, "image"),
        ({"image": 3}, "image"),
        ({"command": "rm -rf /"}, "command"),
        ({"command": ["ok", 3]}, "command[1]"),
        ({"gpus": -1}, "gpus"),
        ({"gpus": True}, "gpus"),
        ({"cpu_milli": 0}, "cpu_milli"),
        ({"cpu_milli": 7.5}, "cpu_milli"),
        ({"memory_mib": "lots"}, "memory_mib"),
        ({"replicas": 0}, "replicas"),
        ({"env": ["A=B"]}, "env"),
        ({"labels": {"gpucloud.tenant": "other"}}, "labels.gpucloud.tenant"),
    ],
)
def test_values_are_type_checked(change: dict[str, Any], field: str) -> None:
    error = refused({**VALID, **change})
    assert error.field == field


def test_the_caller_may_allow_its_own_non_container_keys() -> None:
    check_container_request({**VALID, "project": "alpha", "pool": "shared"}, also_allowed={"project", "pool"})
    assert refused({**VALID, "project": "alpha"}).rule == "unknown_field"


ONE, OTHER = "0123456789abcdef", "fedcba9876543210"


def test_container_names_are_deterministic_and_safe() -> None:
    assert policy.container_name(ONE, "42", 1, 3) == "gpucloud-01234567-w42-r1-a3"
    assert policy.container_name(ONE, "42", 1, 3) == policy.container_name(ONE, "42", 1, 3)
    assert re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", policy.container_name(ONE, "5f0c2a", 0, 0))
    for bad in ("../x", "a b", "", "x/y"):
        with pytest.raises(PermanentDriverError):
            policy.container_name(ONE, bad, 0, 1)


def test_every_docker_name_holds_the_installation_so_two_consoles_never_share_one() -> None:
    """Two consoles on one engine: the same workload, tenant and gang get different names on each."""
    for name in (
        lambda inst: policy.container_name(inst, "1", 0, 1),
        lambda inst: policy.tenant_network_name(inst, "acme"),
        lambda inst: policy.gang_network_name(inst, "1", 0),
    ):
        assert name(ONE) != name(OTHER) and policy.installation_tag(ONE) in name(ONE)
    assert policy.tenant_network_name(ONE, "acme") == "gpucloud-01234567-tenant-acme"
    assert policy.gang_network_name(ONE, "7", 0).startswith(policy.GANG_NETWORK_PREFIX)
    for bad in ("", "0123456", "0123456789ABCDEF", "../../x0123456789"):
        with pytest.raises(PermanentDriverError, match="installation"):
            policy.tenant_network_name(bad, "acme")


def test_managed_labels_carry_identity_and_the_managed_marker() -> None:
    assert policy.managed_labels("42", "acme", 3, 1) == {
        "gpucloud.managed": "1",
        "gpucloud.workload": "42",
        "gpucloud.tenant": "acme",
        "gpucloud.attempt": "3",
        "gpucloud.replica": "1",
    }


def test_service_ports_are_tcp_ports_and_their_variable_a_plain_name() -> None:
    policy.check_service_port(None, "")
    policy.check_service_port(8888, "")
    policy.check_service_port(8888, "JUPYTER_PORT")
    for port, env, rule in [
        (0, "", "invalid_value"),
        (65536, "", "invalid_value"),
        (True, "", "invalid_value"),
        (None, "JUPYTER_PORT", "invalid_value"),
        (8888, "NVIDIA_PORT", "forbidden_env"),
        (8888, "1PORT", "invalid_env_name"),
    ]:
        with pytest.raises(SpecRefused) as caught:
            policy.check_service_port(port, env)
        assert caught.value.rule == rule
        assert caught.value.field == ("service_port" if isinstance(port, int) and not env else "service_port_env")
