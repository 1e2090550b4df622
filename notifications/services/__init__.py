"""All writes of the notifications app: raising notifications, sending them, endpoints and people's choices.

Other apps call the named events (`notify_idle_warning`,
`notify_workload_ended`, `notify_node_health`, `notify_budget_threshold`,
`notify_budget_exhausted`, `notify_request_decided`) or `notify` itself;
docs/notifications.md lists what each sends.
"""

from notifications.services.notify import (
    Listeners,
    listeners,
    notify,
    notify_budget_exhausted,
    notify_budget_threshold,
    notify_idle_warning,
    notify_node_health,
    notify_request_decided,
    notify_work_stopped,
    notify_workload_ended,
    tenant_admins,
)
from notifications.services.preferences import choice_errors, set_email_choices
from notifications.services.sending import (
    enqueue,
    recover_stale_claims,
    retry_delay,
    send_delivery,
    send_due_deliveries,
)
from notifications.services.webhooks import (
    IssuedWebhook,
    create_webhook,
    delete_webhook,
    require_webhooks_manageable,
    rotate_webhook_secret,
    update_webhook,
    webhook_errors,
)

__all__ = [
    "IssuedWebhook",
    "Listeners",
    "choice_errors",
    "create_webhook",
    "delete_webhook",
    "enqueue",
    "listeners",
    "notify",
    "notify_budget_exhausted",
    "notify_budget_threshold",
    "notify_idle_warning",
    "notify_node_health",
    "notify_request_decided",
    "notify_work_stopped",
    "notify_workload_ended",
    "recover_stale_claims",
    "require_webhooks_manageable",
    "retry_delay",
    "rotate_webhook_secret",
    "send_delivery",
    "send_due_deliveries",
    "set_email_choices",
    "tenant_admins",
    "update_webhook",
    "webhook_errors",
]
