"""Accounting: what each tenant, project and user used, from the allocations' exact times, and what it cost."""
