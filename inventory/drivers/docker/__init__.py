"""The Docker runtime: one hardened container per workload replica (see `_runtime` for the contract).

Public: `DockerRuntime`; `container_config` (the engine's create request
for a spec, pure) and `publish_host` (a publish address checked);
`API_VERSION`, the Engine API version the driver speaks; `LOST_RUN_NOTE`,
the exit message of a run the engine lost. The `_`-modules are this
package's own: an import-linter contract (pyproject.toml) keeps every
other module out of them.
"""

from __future__ import annotations

from inventory.drivers.docker._engine import API_VERSION
from inventory.drivers.docker._runtime import LOST_RUN_NOTE, DockerRuntime, container_config, publish_host

__all__ = ["API_VERSION", "LOST_RUN_NOTE", "DockerRuntime", "container_config", "publish_host"]
