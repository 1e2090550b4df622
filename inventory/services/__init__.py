"""Writes of the inventory app: pools, nodes and their lifecycle, provisioning, agent reports.

Every write is a typed keyword-only function that checks who acts, validates,
changes rows in one transaction and records one audit entry per action.
"""

from inventory.services.nodes import (
    IllegalTransition,
    cordon_node,
    drain_node,
    enter_maintenance,
    mark_unreachable_nodes,
    register_node,
    registration_errors,
    retire_node,
    settle_draining_nodes,
    transition_node,
    uncordon_node,
    update_node,
)
from inventory.services.pools import create_node_pool, delete_node_pool, pool_errors, update_node_pool
from inventory.services.provisioning import (
    complete_provisioning,
    dispatch_probe,
    fail_stalled_provisioning,
    provision_node,
)
from inventory.services.telemetry import apply_agent_reports, fail_gpu, record_heartbeats

__all__ = [
    "IllegalTransition",
    "apply_agent_reports",
    "complete_provisioning",
    "cordon_node",
    "create_node_pool",
    "delete_node_pool",
    "dispatch_probe",
    "drain_node",
    "enter_maintenance",
    "fail_gpu",
    "fail_stalled_provisioning",
    "mark_unreachable_nodes",
    "pool_errors",
    "provision_node",
    "record_heartbeats",
    "register_node",
    "registration_errors",
    "retire_node",
    "settle_draining_nodes",
    "transition_node",
    "uncordon_node",
    "update_node",
    "update_node_pool",
]
