"""Replays real GPU cluster traces, or the console's own recorded workloads, in virtual time through the
scheduler core.

`cli.main` is the entry point (`python -m jobs.scheduler.simulator`, `gpucloud simulate`); `engine` holds the
event loop, `traces` the loaders (`console` the console's database), `users` the time limits and checkpoints
users are assumed to set, `predictor` the run-time predictions, `usage` the decayed usage fair share reads,
`metrics` what is measured. docs/simulator.md describes the model.
"""
