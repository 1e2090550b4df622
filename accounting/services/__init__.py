"""All writes of the accounting app: prices, budgets, requests for more, budget notices and hourly rollups.

One module a concern: `prices` (operators add and remove prices), `budgets`
(set, change and delete budgets), `increases` (ask for more quota or budget,
decide, expire), `notices` (announce each budget's thresholds once per
period) and `rollups` (the ledger's hourly figures). Every function is typed
and keyword-only and says in its docstring what it returns and raises.
"""

from accounting.services.prices import add_price, price_errors, remove_price

__all__ = ["add_price", "price_errors", "remove_price"]
