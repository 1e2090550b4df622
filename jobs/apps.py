from django.apps import AppConfig


class JobsConfig(AppConfig):
    """Workloads, their allocations and events, and the scheduler."""

    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        from inventory.holds import register_gpu_holder
        from jobs import checks  # noqa: F401 -- registers the notebook origin's system check
        from jobs.selectors import active_allocations_by_node

        # A draining node reaches maintenance only once no workload holds it.
        register_gpu_holder("jobs.allocations", active_allocations_by_node)

        from celery.signals import after_task_publish

        # A joined node's agent waits on its doorbell, not on its queue: every command published rings it.
        after_task_publish.connect(_ring_node, weak=False, dispatch_uid="jobs.agent_gateway.ring")


def _ring_node(sender: object = None, routing_key: str | None = None, **_: object) -> None:
    from jobs.services.agent_gateway import ring_for_published

    ring_for_published(routing_key)
