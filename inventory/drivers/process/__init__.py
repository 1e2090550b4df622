"""The process runtime: single-host development, each workload a local process group (see `_runtime`).

Public: `ProcessRuntime`; `check_runnable`, `NotRunnable` and `NOBODY`,
whether a command can run as the user a root agent runs workloads as.
The `_`-modules are this package's own: an import-linter contract
(pyproject.toml) keeps every other module out of them.

Each workload's supervisor starts as `python -m
inventory.drivers.process._supervisor`, which imports this package first:
so that it stays stdlib-only and fast, the public names are loaded when
first used (PEP 562), not when the package is imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inventory.drivers.process._launch import NOBODY, NotRunnable, check_runnable
    from inventory.drivers.process._runtime import ProcessRuntime

__all__ = ["NOBODY", "NotRunnable", "ProcessRuntime", "check_runnable"]

_HOMES = {"NOBODY": "_launch", "NotRunnable": "_launch", "check_runnable": "_launch", "ProcessRuntime": "_runtime"}


def __getattr__(name: str) -> object:
    """Return public `name` from the module that defines it; raises AttributeError for any other name."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
