from __future__ import annotations

from django.apps import AppConfig


class AccountingConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "accounting"
    verbose_name = "Accounting"

    def ready(self) -> None:
        # Jobs sits below accounting and asks it about budgets through a port it cannot import past.
        from accounting.selectors.jobs_port import JobsAccounting
        from jobs.accounting_port import register_accounting

        register_accounting(JobsAccounting())
