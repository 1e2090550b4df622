from django.apps import AppConfig


class JobsConfig(AppConfig):
    """Workloads, allocations and the scheduler arrive with the scheduler issue."""

    name = "jobs"
    verbose_name = "Jobs"
