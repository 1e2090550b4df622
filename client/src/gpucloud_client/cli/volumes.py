"""`gpc volumes ls`: the storage volumes every workload of the caller mounts (homes, projects, datasets)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from gpucloud_client.cli.state import AppState

if TYPE_CHECKING:
    from rich.table import Table

    from gpucloud_client.models import Volume

pass_state = click.make_pass_decorator(AppState, ensure=True)


@click.group()
def volumes() -> None:
    """Storage volumes (mounted into workloads automatically; see docs/storage.md)."""


@volumes.command("ls")
@pass_state
def list_volumes(state: AppState) -> None:
    """List the volumes you can see: where workloads mount them, how full they are, and your access."""
    from gpucloud_client.cli.output import emit

    with state.client() as client:
        found = client.volumes()
    emit(state.output, [v.raw for v in found], lambda: volumes_table(found))


def volumes_table(found: list[Volume]) -> Table:
    """Return one row per volume: kind, name, mount path, project or owner, use against the limit, access."""
    from gpucloud_client.cli.output import make_table, size

    def access(volume: Volume) -> str:
        return "rw" if volume.can_write else "ro" if volume.can_read else "-"

    rows = [
        (v.kind, v.name, v.mount_path, v.project or v.owner, size(v.used_bytes), size(v.size_limit_bytes), access(v))
        for v in found
    ]
    return make_table(("KIND", "NAME", "MOUNTED AT", "PROJECT/OWNER", "USED", "LIMIT", "ACCESS"), rows)


COMMANDS = [volumes]
