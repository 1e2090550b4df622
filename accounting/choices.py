"""The resources that have a price, and the dimensions a usage report groups by."""

from __future__ import annotations

from django.db import models


class Resource(models.TextChoices):
    """What a price is for: one GPU for an hour, one CPU core for an hour, or one GiB of memory for an hour."""

    GPU = "gpu", "GPU-hour"
    CPU = "cpu", "CPU-hour"
    MEMORY = "memory", "GiB-hour of memory"


class Dimension(models.TextChoices):
    """What a usage report's rows are grouped by. Tenant admins may group by all but `tenant`."""

    TENANT = "tenant", "Tenant"
    PROJECT = "project", "Project"
    USER = "user", "User"
    POOL = "pool", "Pool"
    GPU_MODEL = "gpu_model", "GPU model"
    WORKLOAD = "workload", "Workload"
