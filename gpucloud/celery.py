"""The Celery app: Redis as broker when REDIS_URL is set, an in-process transport in embedded mode."""

from __future__ import annotations

import os

from celery import Celery

from common.control import PromptAcks, RecoverOnConnect

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")

app = Celery("gpucloud")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# The agent's tasks live in a sub-package of the inventory app.
app.autodiscover_tasks(["inventory.agent"])
# Control work: every worker clears the coalescing markers when its consumer (re)connects, and acknowledges
# control messages as it takes them (common.control says why).
app.steps["consumer"].add(RecoverOnConnect)
app.steps["consumer"].add(PromptAcks)
