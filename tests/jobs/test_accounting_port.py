"""Jobs asks accounting about budgets through a port: accounting fills it at start-up, and asking without
it fails loudly instead of skipping budgets."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from accounting.selectors.jobs_port import JobsAccounting
from jobs import accounting_port


def test_accounting_answers_jobs_once_django_has_started() -> None:
    assert isinstance(accounting_port.accounting(), JobsAccounting)


def test_asking_with_no_accounting_registered_refuses_rather_than_skipping_budgets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(accounting_port, "_registered", [])
    with pytest.raises(ImproperlyConfigured):
        accounting_port.accounting().enforced_budgets(now=timezone.now())
