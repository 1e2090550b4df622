"""common.groupcommit: concurrent `run`s handled in batches by one worker thread, each caller answered alone.

No database: the handlers are plain functions. `Gate` holds the worker in
its first batch until the test releases it, so items queued meanwhile
deterministically form the next batches; every wait is bounded, so a worker
that never answers fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from common.groupcommit import GroupCommit

TIMEOUT = 5.0  # seconds; only reached when something is broken


def answer(item: Any) -> str:
    return f"answer-{item}"


class Gate:
    """A handler that holds its first batch until `release()`, and records every batch it is given."""

    def __init__(self, respond: Callable[[list[Any]], list[Any]] | None = None) -> None:
        self.respond = respond or (lambda items: [answer(item) for item in items])
        self.entered = threading.Event()
        self.released = threading.Event()
        self.batches: list[list[Any]] = []

    def __call__(self, items: list[Any]) -> list[Any]:
        self.batches.append(list(items))
        if len(self.batches) == 1:
            self.entered.set()
            assert self.released.wait(TIMEOUT), "the test never released the first batch"
        return self.respond(items)

    def release(self) -> None:
        self.released.set()


def group(gate: Gate, *, max_weight: int = 100, weight: Callable[[Any], int] | None = None) -> GroupCommit[Any, Any]:
    if weight is None:
        return GroupCommit(gate, name="test-group", max_weight=max_weight)
    return GroupCommit(gate, name="test-group", max_weight=max_weight, weight=weight)


async def hold_first_batch(gc: GroupCommit[Any, Any], gate: Gate, item: Any) -> asyncio.Task[Any]:
    """Start a run of `item` and return it once the worker is inside `handle` with it (and so holds nothing else)."""
    task = asyncio.create_task(gc.run(item))
    assert await asyncio.to_thread(gate.entered.wait, TIMEOUT), "the first batch never reached the handler"
    return task


async def queue(gc: GroupCommit[Any, Any], items: Sequence[Any]) -> list[asyncio.Task[Any]]:
    """Start runs of `items`, in order, and return once each has queued its item."""
    tasks = [asyncio.create_task(gc.run(item)) for item in items]
    # One pass of the event loop, not a wait: the tasks run in creation order up to their first `await`,
    # and `run` queues its item before that.
    await asyncio.sleep(0)
    return tasks


async def outcomes(tasks: Sequence[asyncio.Task[Any]]) -> list[Any]:
    """Return each task's result, or the exception it raised."""
    return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), TIMEOUT)


def assert_counted(gc: GroupCommit[Any, Any], gate: Gate) -> None:
    assert (gc.batches, gc.items) == (len(gate.batches), sum(len(batch) for batch in gate.batches))


def test_concurrent_runs_share_batches_and_each_caller_gets_its_own_result() -> None:
    gate = Gate()
    gc = group(gate)

    async def scenario() -> list[Any]:
        first = await hold_first_batch(gc, gate, 0)
        waiting = await queue(gc, range(1, 7))
        gate.release()
        return await outcomes([first, *waiting])

    assert asyncio.run(scenario()) == [answer(item) for item in range(7)]
    assert gate.batches == [[0], [1, 2, 3, 4, 5, 6]]
    assert gc.batches < gc.items
    assert_counted(gc, gate)


def test_each_result_goes_to_the_item_it_answers() -> None:
    gate = Gate(lambda items: [item * item for item in items])
    gc = group(gate)

    async def scenario() -> list[Any]:
        first = await hold_first_batch(gc, gate, 1)
        waiting = await queue(gc, [5, 3, 4, 2])
        gate.release()
        return await outcomes([first, *waiting])

    assert asyncio.run(scenario()) == [1, 25, 9, 16, 4]
    assert gate.batches == [[1], [5, 3, 4, 2]]


def test_a_lone_item_is_handled_at_once_in_a_batch_of_its_own() -> None:
    gate = Gate()
    gate.release()
    gc = group(gate)

    async def one(item: str) -> Any:
        return await asyncio.wait_for(gc.run(item), TIMEOUT)

    assert asyncio.run(one("a")) == answer("a")
    assert (gc.batches, gc.items) == (1, 1)
    assert asyncio.run(one("b")) == answer("b")
    assert gate.batches == [["a"], ["b"]]
    assert_counted(gc, gate)


def test_batches_keep_within_the_weight_bound_and_the_order_of_arrival() -> None:
    gate = Gate()
    weights = {"held": 1, "a": 2, "b": 2, "big": 5, "c": 2, "d": 1, "e": 1, "f": 2}
    gc = group(gate, max_weight=3, weight=weights.__getitem__)

    async def scenario() -> list[Any]:
        first = await hold_first_batch(gc, gate, "held")
        waiting = await queue(gc, ["a", "b", "big", "c", "d", "e", "f"])
        gate.release()
        return await outcomes([first, *waiting])

    assert asyncio.run(scenario()) == [answer(item) for item in weights]
    # An item that does not fit starts the next batch; one heavier than the bound goes alone.
    assert gate.batches == [["held"], ["a"], ["b"], ["big"], ["c", "d"], ["e", "f"]]
    assert [item for batch in gate.batches for item in batch] == list(weights)
    assert all(sum(weights[i] for i in batch) <= 3 or len(batch) == 1 for batch in gate.batches)
    assert_counted(gc, gate)


def test_when_handle_raises_every_caller_of_the_batch_gets_the_error_and_the_next_batch_works() -> None:
    def respond(items: list[Any]) -> list[Any]:
        if "boom" in items:
            raise ValueError("boom")
        return [answer(item) for item in items]

    gate = Gate(respond)
    gc = group(gate)

    async def scenario() -> tuple[list[Any], Any]:
        first = await hold_first_batch(gc, gate, "first")
        waiting = await queue(gc, ["x", "boom", "y"])
        gate.release()
        failed = await outcomes([first, *waiting])
        return failed, await asyncio.wait_for(gc.run("after"), TIMEOUT)

    failed, after = asyncio.run(scenario())
    assert failed[0] == answer("first")
    assert all(isinstance(error, ValueError) and str(error) == "boom" for error in failed[1:])
    assert after == answer("after")
    assert gate.batches == [["first"], ["x", "boom", "y"], ["after"]]
    assert_counted(gc, gate)


def test_a_wrong_number_of_results_fails_every_caller_of_the_batch() -> None:
    gate = Gate(lambda items: [answer(item) for item in items][:-1] if len(items) > 1 else [answer(items[0])])
    gc = group(gate)

    async def scenario() -> tuple[list[Any], Any]:
        first = await hold_first_batch(gc, gate, "first")
        waiting = await queue(gc, ["x", "y", "z"])
        gate.release()
        failed = await outcomes([first, *waiting])
        return failed, await asyncio.wait_for(gc.run("after"), TIMEOUT)

    failed, after = asyncio.run(scenario())
    assert failed[0] == answer("first")
    assert all(isinstance(error, RuntimeError) and "2 results for 3 items" in str(error) for error in failed[1:])
    assert after == answer("after")
    assert_counted(gc, gate)


def test_a_caller_cancelled_while_waiting_does_not_break_the_worker() -> None:
    gate = Gate()
    gc = group(gate)

    async def scenario() -> tuple[list[Any], Any]:
        first = await hold_first_batch(gc, gate, "first")
        waiting = await queue(gc, ["a", "b", "c"])
        first.cancel()  # its batch is being handled
        waiting[1].cancel()  # its item is still queued
        gate.release()
        answered = await outcomes([first, *waiting])
        return answered, await asyncio.wait_for(gc.run("later"), TIMEOUT)

    answered, later = asyncio.run(scenario())
    assert isinstance(answered[0], asyncio.CancelledError) and isinstance(answered[2], asyncio.CancelledError)
    assert [answered[1], answered[3], later] == [answer("a"), answer("c"), answer("later")]
    # The worker cannot take back a queued item; it handles it and drops the answer.
    assert gate.batches == [["first"], ["a", "b", "c"], ["later"]]
    assert_counted(gc, gate)


def test_a_caller_whose_event_loop_has_closed_does_not_break_the_worker() -> None:
    gate = Gate()
    gc = group(gate)

    async def leave() -> None:
        await queue(gc, ["gone"])  # asyncio.run then cancels the run and closes the loop

    async def scenario() -> list[Any]:
        first = await hold_first_batch(gc, gate, "first")
        await asyncio.to_thread(asyncio.run, leave())
        alive = await queue(gc, ["alive"])  # in the same batch, after the answer that cannot be delivered
        gate.release()
        return [*await outcomes([first, *alive]), await asyncio.wait_for(gc.run("later"), TIMEOUT)]

    assert asyncio.run(scenario()) == [answer("first"), answer("alive"), answer("later")]
    assert gate.batches == [["first"], ["gone", "alive"], ["later"]]


def test_callers_on_two_event_loops_in_two_threads_both_get_their_answers() -> None:
    gate = Gate()
    gc = group(gate)
    results: dict[str, Any] = {}

    def caller(item: str) -> None:
        results[item] = asyncio.run(asyncio.wait_for(gc.run(item), TIMEOUT))

    threads = [threading.Thread(target=caller, args=(item,)) for item in ("left", "right")]

    async def scenario() -> Any:
        first = await hold_first_batch(gc, gate, "first")
        for thread in threads:
            thread.start()
        gate.release()
        return (await outcomes([first]))[0]

    assert asyncio.run(scenario()) == answer("first")
    for thread in threads:
        thread.join(TIMEOUT)
        assert not thread.is_alive()
    assert results == {"left": answer("left"), "right": answer("right")}
    assert sorted(item for batch in gate.batches for item in batch) == ["first", "left", "right"]
    assert_counted(gc, gate)


@pytest.mark.parametrize("item_count", [1, 5])
def test_the_counters_add_up_over_many_rounds(item_count: int) -> None:
    gate = Gate()
    gate.release()
    gc = group(gate, max_weight=2)

    async def rounds() -> list[Any]:
        got: list[Any] = []
        for round_number in range(3):
            got += await outcomes([asyncio.create_task(gc.run((round_number, i))) for i in range(item_count)])
        return got

    assert asyncio.run(rounds()) == [answer((r, i)) for r in range(3) for i in range(item_count)]
    assert gc.items == 3 * item_count
    assert all(len(batch) <= 2 for batch in gate.batches)
    assert_counted(gc, gate)


def test_an_item_that_cannot_be_weighed_goes_alone_and_is_answered() -> None:
    def weight(item: Any) -> int:
        if item == "unweighable":
            raise ValueError(item)
        return 1

    gate = Gate()
    gc = group(gate, max_weight=10, weight=weight)

    async def scenario() -> list[Any]:
        first = await hold_first_batch(gc, gate, "first")
        rest = await queue(gc, ["a", "unweighable", "b"])
        gate.release()
        return await outcomes([first, *rest])

    assert asyncio.run(scenario()) == [answer(i) for i in ("first", "a", "unweighable", "b")]
    assert gate.batches == [["first"], ["a"], ["unweighable"], ["b"]]


def test_with_two_workers_a_batch_is_handled_while_the_one_before_it_is_still_held() -> None:
    gate = Gate()
    gc = GroupCommit(gate, name="test-group", max_weight=100, workers=2)

    async def scenario() -> tuple[list[Any], bool]:
        first = await hold_first_batch(gc, gate, "first")
        rest = await queue(gc, ["a", "b"])
        answered = await outcomes(rest)  # the second worker answers these while the first batch is held
        still_held = not first.done()
        gate.release()
        return [*answered, await asyncio.wait_for(first, TIMEOUT)], still_held

    answers, still_held = asyncio.run(scenario())
    assert still_held
    assert answers == [answer("a"), answer("b"), answer("first")]
    # The second worker may take "a" before "b" is queued: together or apart, after "first" and in order.
    assert gate.batches[0] == ["first"]
    assert [item for batch in gate.batches[1:] for item in batch] == ["a", "b"]
    assert_counted(gc, gate)
