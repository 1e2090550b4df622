"""The name of every Celery task that is not a protocol message, written once.

A task's decorator (`@shared_task(name=...)`), whoever sends it, the routes
and the beat schedule (`gpucloud/settings.py`) all import its name from
here. Tasks that carry a message between the controller and an agent are
named by their message class instead (`common.protocol.messages`:
`ReplicaExited.TASK`). Plain Python with no import: settings import it.
"""

from __future__ import annotations

# jobs: scheduling, launching, the ledger's timers and the logs.
SCHEDULE_PASS = "jobs.schedule_pass"  # noqa: S105 -- a task name, not a secret
LAUNCH_WORKLOADS = "jobs.launch_workloads"
ENFORCE_TIME_LIMITS = "jobs.enforce_time_limits"
CONFIRM_START_TIMEOUTS = "jobs.confirm_start_timeouts"
CHECK_IDLE_NOTEBOOKS = "jobs.check_idle_notebooks"
STOP_ORPHANED_WORK = "jobs.stop_orphaned_work"
PURGE_EXPIRED_LOGS = "jobs.purge_expired_logs"
INGEST_LOGS = "jobs.ingest_logs"

# inventory: provisioning, heartbeats, node health, telemetry and storage.
PROVISION_NODE = "inventory.provision_node"
COMPLETE_PROVISIONING = "inventory.complete_provisioning"
APPLY_HEARTBEATS = "inventory.apply_heartbeats"
HEARTBEAT_SIMULATED_NODES = "inventory.heartbeat_simulated_nodes"
CHECK_NODES = "inventory.check_nodes"
PURGE_TELEMETRY = "inventory.purge_telemetry"
MEASURE_VOLUME_USAGE = "inventory.measure_volume_usage"

# accounting
ROLL_UP_USAGE = "accounting.roll_up_usage"
EXPIRE_INCREASE_REQUESTS = "accounting.expire_increase_requests"
ANNOUNCE_BUDGET_THRESHOLDS = "accounting.announce_budget_thresholds"

# notifications
SEND_DELIVERY = "notifications.send_delivery"
SEND_DUE_DELIVERIES = "notifications.send_due_deliveries"

# tenants
PURGE_EXPIRED_SESSIONS = "tenants.purge_expired_sessions"
