"""`gpc top`: live GPU utilization of one's running workloads, one row per GPU (q or Ctrl-C quits).

The display itself is in `top_live.py` (imported when the command runs: asyncio and rich are not cheap).
"""

from __future__ import annotations

import click

from gpucloud_client.cli.state import AppState

pass_state = click.make_pass_decorator(AppState, ensure=True)


@click.command()
@click.option(
    "--interval", type=click.FloatRange(0.2, 60), default=1.0, show_default=True, help="Seconds between redraws."
)
@click.option("--all", "everyone", is_flag=True, help="Every running workload of the tenant, not only yours.")
@pass_state
def top(state: AppState, interval: float, everyone: bool) -> None:
    """Show the GPU utilization, memory, power and temperature of your running workloads, live.

    One row per GPU held; q or Ctrl-C quits and gives the terminal back as it was. With -o json|yaml it
    prints every sample batch as it arrives instead ({"workload": ID, "node", "at", "gpus": [...]}).
    """
    import asyncio

    from gpucloud_client.cli.top_live import run_top

    asyncio.run(run_top(state, interval, everyone))


COMMANDS = [top]
