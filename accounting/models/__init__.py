"""Accounting's tables: prices with history (prices.py), budgets (budgets.py), requests for more (requests.py).

Usage itself is read from the allocations (the ledger), settled hours of it from hourly rollups (rollups.py).
"""

from __future__ import annotations

from accounting.models.budgets import Budget
from accounting.models.prices import Price
from accounting.models.requests import IncreaseRequest
from accounting.models.rollups import RollupMark, UsageHour

__all__ = ["Budget", "IncreaseRequest", "Price", "RollupMark", "UsageHour"]
