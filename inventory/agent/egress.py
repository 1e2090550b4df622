"""The agent's part in egress: install the rules of workload bridges at start, put them back on every reconcile.

The rules themselves are `inventory.drivers.egress`. An agent whose
configuration asks for them (`AgentConfig.egress_rules`, every agent the
environment describes unless GPUCLOUD_AGENT_EGRESS is off) installs them
when it starts and checks them on every reconcile (`agent.list_replicas`):
whatever changed or went missing is put back and logged as a warning. A
host where they cannot be installed (no iptables, not root) logs an error
each time, so an operator sees that containers there reach the host.
"""

from __future__ import annotations

import logging

from inventory.agent.config import AgentConfig
from inventory.drivers import egress
from inventory.drivers.base import PermanentDriverError

log = logging.getLogger(__name__)


def keep_egress(config: AgentConfig | None) -> bool | None:
    """Install or refresh the egress rules `config` asks for; return whether they changed, None when not asked
    for or when they could not be installed (logged as an error)."""
    if config is None or not config.egress_rules:
        return None
    try:
        return egress.install_egress(egress.parse_allowed(config.egress_allowed))
    except (PermanentDriverError, ValueError) as error:
        log.error("node %s: egress rules of workload bridges not installed: %s", config.node, error)
        return None
