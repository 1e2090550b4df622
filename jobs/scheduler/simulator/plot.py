"""The PNG plot of a simulation: GPUs allocated and queue length over time, per tenant."""

from __future__ import annotations

from pathlib import Path

from jobs.scheduler.simulator.metrics import Series

# Enough points for a readable line; a 125-day trace has tens of thousands of passes.
_MAX_POINTS = 2_000


def save_plot(series: Series, path: Path, title: str) -> None:
    """Write a two-panel PNG (allocated GPUs stacked by tenant; queued workloads per tenant) to `path`."""
    import matplotlib  # here, not at the top: only a plot needs it and it is slow to import

    matplotlib.use("Agg")
    from matplotlib import pyplot  # after the backend is chosen

    step = max(1, len(series.times) // _MAX_POINTS)
    days = [t / 86_400 for t in series.times[::step]]
    tenants = sorted(series.allocated)
    figure, (top, bottom) = pyplot.subplots(2, 1, figsize=(12, 8), sharex=True)
    top.stackplot(days, [series.allocated[t][::step] for t in tenants], labels=tenants, step="post")
    top.set_ylabel("GPUs allocated")
    top.set_title(title)
    top.legend(loc="upper left", fontsize="x-small", ncol=3)
    for tenant in tenants:
        bottom.step(days, series.queued[tenant][::step], where="post", label=tenant, linewidth=0.8)
    bottom.set_ylabel("workloads queued")
    bottom.set_xlabel("days since trace start")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
