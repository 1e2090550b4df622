"""`ls --watch`'s model (which rows the live table shows as events arrive) and the live display's key
handling, without a terminal or a console: the streams themselves are tests/client/'s (under tmux)."""

from __future__ import annotations

import asyncio
import io

import pytest
from rich.console import Console

from gpucloud_client.cli.live import quit_keys, run_live
from gpucloud_client.cli.watch import WatchModel
from gpucloud_client.cli.workloads import ListFilters
from gpucloud_client.models import Workload, WorkloadRow


def row(id: int, state: str, kind: str = "job", **extra: object) -> WorkloadRow:
    return WorkloadRow.from_json(
        {"id": id, "name": f"w{id}", "kind": kind, "project": "vision", "state": state, **extra}
    )


def shown(model: WatchModel) -> dict[int, str]:
    return {entry.id: entry.state for entry in model.entries.values()}


def test_rows_update_in_place_and_an_ended_workload_keeps_its_final_state() -> None:
    model = WatchModel([Workload(id=1, name="w1", kind="job", state="pending", owner="ada")], ListFilters())

    assert model.apply(row(1, "running", queue_position=None))
    assert model.apply(row(1, "succeeded"))
    assert model.apply(row(2, "pending", queue_position=4, reason_code="QUOTA_EXCEEDED"))
    assert not model.apply(row(3, "failed"))  # ended before it was ever on show

    assert shown(model) == {1: "succeeded", 2: "pending"}
    assert model.entries[1].owner == "ada" and model.entries[2].queue == 4


def test_state_and_kind_filters_hold_as_rows_change() -> None:
    pending = WatchModel([], ListFilters(state="pending"))
    notebooks = WatchModel([], ListFilters(kind="notebook", show_all=True))

    pending.apply(row(1, "pending"))
    assert pending.apply(row(1, "running"))  # it left the state asked for: off the table
    notebooks.apply(row(2, "failed", kind="notebook"))
    notebooks.apply(row(3, "running"))

    assert shown(pending) == {}
    assert shown(notebooks) == {2: "failed"}


def test_owner_filter_reads_each_new_workload_once() -> None:
    model = WatchModel([], ListFilters(owner="ada"))
    theirs = Workload(id=5, name="w5", kind="job", state="pending", owner="bob")
    mine = Workload(id=6, name="w6", kind="job", state="pending", owner="ada", gpus_per_replica=2)

    assert model.needs_lookup(row(5, "pending"))
    assert not model.apply(row(5, "pending"), theirs)
    assert not model.needs_lookup(row(5, "running")) and not model.apply(row(5, "running"))
    assert model.apply(row(6, "pending"), mine)
    assert not model.needs_lookup(row(6, "running"))

    assert shown(model) == {6: "pending"} and model.entries[6].gpus == "2"


def test_a_new_workload_is_read_once_so_its_owner_and_gpus_show() -> None:
    model = WatchModel([], ListFilters())
    fresh = Workload(id=7, name="w7", kind="job", state="pending", owner="ada", gpus_per_replica=4)
    assert model.needs_lookup(row(7, "pending"))
    assert model.apply(row(7, "pending"), fresh)
    assert not model.needs_lookup(row(7, "running"))
    assert (model.entries[7].owner, model.entries[7].gpus) == ("ada", "4")
    assert not model.needs_lookup(row(8, "succeeded")), "an ended workload new to the table is not shown: not read"


def test_the_table_lists_newest_first_under_its_title() -> None:
    model = WatchModel([], ListFilters())
    model.apply(row(1, "running"))
    model.apply(row(2, "pending", queue_position=1))
    out = io.StringIO()

    Console(file=out, width=150, color_system=None).print(model.render("workloads of acme (live; q quits)"))

    lines = out.getvalue().splitlines()
    assert lines[0] == "workloads of acme (live; q quits)"
    assert [line.split()[0] for line in lines[2:]] == ["2", "1"]


def test_quit_keys_without_a_terminal_does_nothing() -> None:
    async def check() -> bool:
        event = asyncio.Event()
        with quit_keys(asyncio.get_running_loop(), event):
            await asyncio.sleep(0)
        return event.is_set()

    assert asyncio.run(check()) is False


def test_run_live_redraws_on_each_change_and_ends_with_its_producers() -> None:
    frames: list[int] = []
    counter = [0]

    async def produce(changed: asyncio.Event) -> None:
        for _ in range(3):
            counter[0] += 1
            changed.set()
            await asyncio.sleep(0.01)

    def render() -> str:
        frames.append(counter[0])
        return f"count {counter[0]}"

    async def main() -> None:
        changed = asyncio.Event()
        await run_live(render, [produce(changed)], changed, interval=0.05)

    asyncio.run(main())

    assert frames[0] == 0 and frames[-1] == 3


def test_run_live_raises_what_a_producer_raised() -> None:
    async def fail() -> None:
        raise RuntimeError("stream closed for good")

    async def main() -> None:
        await run_live(lambda: "", [fail()], asyncio.Event(), interval=0.01)

    with pytest.raises(RuntimeError, match="stream closed for good"):
        asyncio.run(main())
