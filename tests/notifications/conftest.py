"""Notification tests: webhooks may reach 127.0.0.1 (the receivers), and e-mail goes to a real SMTP server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.notifications.servers import Mailbox, smtp_server


@pytest.fixture(autouse=True)
def _notification_settings(settings: Any) -> None:
    # The receivers listen on 127.0.0.1; production refuses private addresses unless told otherwise.
    settings.NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE = True
    settings.NOTIFICATIONS_WEBHOOK_TIMEOUT_SECONDS = 5
    settings.NOTIFICATIONS_MAX_ATTEMPTS = 3
    settings.NOTIFICATIONS_RETRY_BASE_SECONDS = 30
    settings.NOTIFICATIONS_RETRY_MAX_SECONDS = 3600
    settings.NOTIFICATIONS_EMAIL = False


@pytest.fixture
def mailbox(settings: Any) -> Iterator[Mailbox]:
    """A real SMTP server on 127.0.0.1 that Django's SMTP backend sends to; e-mail is on."""
    with smtp_server() as (box, port):
        # pytest-django swaps in the in-memory backend; these tests talk SMTP for real.
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST = "127.0.0.1"
        settings.EMAIL_PORT = port
        settings.EMAIL_USE_TLS = False
        settings.EMAIL_USE_SSL = False
        settings.EMAIL_TIMEOUT = 5
        settings.NOTIFICATIONS_EMAIL = True
        yield box
