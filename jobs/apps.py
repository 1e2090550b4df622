from django.apps import AppConfig


class JobsConfig(AppConfig):
    """Workloads, their allocations and events, and the scheduler."""

    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        from inventory.holds import register_gpu_holder
        from jobs.selectors import active_allocations_by_node

        # A draining node reaches maintenance only once no workload holds it.
        register_gpu_holder("jobs.allocations", active_allocations_by_node)
