"""What the Docker runtime asks the engine for, and where a published port is reached: pure, no engine call.

`container_config` builds a replica's hardened container request;
`publish_host`, `inspected_endpoint` and `listed_endpoint` turn the
runtime's publish address and the engine's port bindings into the
endpoint a handle carries.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

import docker.types

from inventory.drivers import policy
from inventory.drivers.base import PermanentDriverError, WorkloadSpec, endpoint_url
from inventory.drivers.docker._engine import API_VERSION


def container_config(
    spec: WorkloadSpec,
    *,
    user: str,
    network: str,
    log_max_size: str = "50m",
    api_version: str = API_VERSION,
    publish_address: str = "127.0.0.1",
) -> dict[str, Any]:
    """Return the keyword arguments of `APIClient.create_container` for `spec`; pure, no engine call.

    The hardened defaults of the module docstring; `network` is the tenant's
    bridge. Device requests appear only when `spec.gpu_uuids` is non-empty;
    a port binding (`spec.service_port` on `publish_address`, host port left
    to the engine) only when the spec has a service port. Each of
    `spec.mounts` is a bind mount of its `source` (already prepared: only
    that directory of the host is reachable), read-only when it says so.
    The container runs as `spec.run_as` (uid:gid, its groups added) when
    set, else as `user`; in `spec.workdir`, which is also its HOME unless
    the spec's environment sets one; `docker stop` sends `spec.stop_signal`.
    Its `/dev/shm` holds `spec.resources.shm_mib` MiB (None: the engine's 64 MiB).
    """
    gpus = list(spec.gpu_uuids)
    memory = spec.resources.memory_mib * 1024 * 1024
    port = spec.service_port
    run_as = spec.run_as
    binds = [docker.types.Mount(m.target, m.source, type="bind", read_only=m.read_only) for m in spec.mounts]
    host_config = docker.types.HostConfig(
        version=api_version,
        network_mode=network,
        privileged=False,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        ipc_mode="private",
        pids_limit=spec.resources.pids,
        mem_limit=memory,
        memswap_limit=memory,
        # The engine's default /dev/shm is 64 MiB, too small for NCCL and data loaders; its pages count as memory.
        shm_size=spec.resources.shm_mib * 1024 * 1024 if spec.resources.shm_mib is not None else None,
        nano_cpus=spec.resources.cpu_milli * 1_000_000,
        init=True,
        log_config=docker.types.LogConfig(type="json-file", config={"max-size": log_max_size, "max-file": "3"}),
        device_requests=[docker.types.DeviceRequest(driver="nvidia", device_ids=gpus, capabilities=[["gpu"]])]
        if gpus
        else None,
        port_bindings={port: (publish_address,)} if port is not None else None,
        mounts=binds or None,
        group_add=[str(group) for group in run_as.groups] if run_as is not None and run_as.groups else None,
    )
    host_config["Privileged"] = False  # the default, stated so the request shows it
    # Inside its own network namespace the workload keeps the port it asked for.
    served = {spec.service_port_env: str(port)} if port is not None and spec.service_port_env else {}
    home = {"HOME": spec.workdir} if spec.workdir else {}
    environment = {**home, **spec.env, **served, "NVIDIA_VISIBLE_DEVICES": ",".join(gpus) if gpus else "void"}
    identity = policy.managed_labels(
        spec.workload_id, spec.tenant, spec.attempt, spec.replica, installation=spec.installation, node=spec.node
    )
    labels = {**spec.labels, **identity}
    return {
        "image": spec.image,
        "command": list(spec.command) or None,
        "name": spec.name,
        "user": f"{run_as.uid}:{run_as.gid}" if run_as is not None else user,
        "working_dir": spec.workdir or None,
        "environment": environment,
        "labels": labels,
        "host_config": host_config,
        "ports": [port] if port is not None else None,
        "detach": True,
        "stop_signal": spec.stop_signal,
    }


def publish_host(address: str) -> str:
    """Return `address` if service ports can be published there; raises PermanentDriverError otherwise.

    It must be one IP address the console can reach: the endpoint is built
    from it, so a wildcard (0.0.0.0, ::) would both expose every workload on
    every interface and give the console no address to dial.
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError as error:
        raise PermanentDriverError(
            f"publish address {address!r} is not an IP address", code="invalid_publish_address"
        ) from error
    if ip.is_unspecified:
        raise PermanentDriverError(
            f"publish address {address} is a wildcard; give the address the console reaches this node on",
            code="invalid_publish_address",
        )
    return str(ip)


def _published(bindings: Iterable[tuple[str, int]], prefer: str) -> str | None:
    """Return the endpoint of the first binding on `prefer` (else the first binding), or None without any."""
    found = sorted(bindings, key=lambda binding: binding[0] != prefer)
    return endpoint_url(*found[0]) if found else None


def inspected_endpoint(attrs: dict[str, Any], port: int | None, prefer: str) -> str | None:
    """Return where `inspect_container`'s answer `attrs` publishes container port `port`; None when not (running)."""
    if port is None:
        return None
    bindings = ((attrs.get("NetworkSettings") or {}).get("Ports") or {}).get(f"{port}/tcp") or []
    return _published(((b["HostIp"], int(b["HostPort"])) for b in bindings if b.get("HostPort")), prefer)


def listed_endpoint(entry: dict[str, Any], prefer: str) -> str | None:
    """Return where a `containers()` entry publishes a port (the runtime publishes only the service port)."""
    ports = entry.get("Ports") or []
    return _published(((p.get("IP") or "", int(p["PublicPort"])) for p in ports if p.get("PublicPort")), prefer)
