"""Replays real GPU cluster traces in virtual time through the scheduler core.

`cli.main` is the entry point (`python -m jobs.scheduler.simulator`); `engine`
holds the event loop, `traces` the loaders, `metrics` what is measured.
"""
