"""The scheduler: a pure core (`jobs.scheduler.core`) and a trace simulator (`jobs.scheduler.simulator`).

The core takes a frozen snapshot and returns decisions; it never does I/O. The
database shell that builds snapshots and commits decisions lives beside it.
"""
