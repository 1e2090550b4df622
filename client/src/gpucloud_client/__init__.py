"""gpucloud's Python client: typed sync and async access to a console's API (the `gpc` CLI is built on it).

    from gpucloud_client import Client, Config

    with Client(Config.load().resolve()) as gpc:
        print([w.name for w in gpc.workloads(state="running")])

The names below are loaded on first use (PEP 562), so `import gpucloud_client` costs no httpx, websockets
or PyYAML: the CLI's start-up depends on it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "Client": "client",
    "AsyncClient": "aclient",
    "ApiError": "errors",
    "ClientError": "errors",
    "ConfigError": "errors",
    "ConnectionFailed": "errors",
    "FieldError": "errors",
    "SpecError": "errors",
    "SpecIssue": "errors",
    "StreamError": "streams",
    "Config": "config",
    "Context": "config",
    "redact": "config",
    "load_spec": "spec",
    "SpecDocument": "spec",
    "Allocation": "models",
    "GpuBatch": "models",
    "GpuSample": "models",
    "LaunchStep": "models",
    "LogLine": "models",
    "LogPage": "models",
    "Me": "models",
    "Quota": "models",
    "QuotaUse": "models",
    "Volume": "models",
    "Workload": "models",
    "WorkloadDetail": "models",
    "WorkloadEvent": "models",
    "WorkloadRow": "models",
}

__all__ = [
    "Allocation",
    "ApiError",
    "AsyncClient",
    "Client",
    "ClientError",
    "Config",
    "ConfigError",
    "ConnectionFailed",
    "Context",
    "FieldError",
    "GpuBatch",
    "GpuSample",
    "LaunchStep",
    "LogLine",
    "LogPage",
    "Me",
    "Quota",
    "QuotaUse",
    "SpecDocument",
    "SpecError",
    "SpecIssue",
    "StreamError",
    "Volume",
    "Workload",
    "WorkloadDetail",
    "WorkloadEvent",
    "WorkloadRow",
    "load_spec",
    "redact",
]

if TYPE_CHECKING:
    from gpucloud_client.aclient import AsyncClient
    from gpucloud_client.client import Client
    from gpucloud_client.config import Config, Context, redact
    from gpucloud_client.errors import (
        ApiError,
        ClientError,
        ConfigError,
        ConnectionFailed,
        FieldError,
        SpecError,
        SpecIssue,
    )
    from gpucloud_client.models import (
        Allocation,
        GpuBatch,
        GpuSample,
        LaunchStep,
        LogLine,
        LogPage,
        Me,
        Quota,
        QuotaUse,
        Volume,
        Workload,
        WorkloadDetail,
        WorkloadEvent,
        WorkloadRow,
    )
    from gpucloud_client.spec import SpecDocument, load_spec
    from gpucloud_client.streams import StreamError


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpucloud_client' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"gpucloud_client.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
