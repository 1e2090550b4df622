"""The GPU probe of real hosts, through NVML: `NvmlProbe` (see `_probe` for the contract).

The `_`-modules are this package's own: an import-linter contract
(pyproject.toml) keeps every other module out of them.
"""

from __future__ import annotations

from inventory.drivers.nvml._probe import NvmlProbe

__all__ = ["NvmlProbe"]
