"""The Celery app: Redis as broker when REDIS_URL is set, an in-process transport in embedded mode."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")

app = Celery("gpucloud")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# The agent's tasks live in a sub-package of the inventory app.
app.autodiscover_tasks(["inventory.agent"])
