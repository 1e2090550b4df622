"""The Celery app: Redis as broker when REDIS_URL is set, an in-process transport in embedded mode."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import before_task_publish

from common.control import PromptAcks, RecoverOnConnect, stamp_protocol_version, stamp_sent_at

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
# Every message says when it was sent: the controller judges timeouts as of the moment its evidence is
# complete (common.control.evidence_time).
before_task_publish.connect(stamp_sent_at, weak=False, dispatch_uid="gpucloud.sent_at")
# Every protocol message's task names the version of its shape, which its task checks (common.control.decode).
before_task_publish.connect(stamp_protocol_version, weak=False, dispatch_uid="gpucloud.protocol_version")
