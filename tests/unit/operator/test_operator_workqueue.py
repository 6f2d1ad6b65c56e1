"""The operator's work queue: coalescing, one worker per key, priorities, deadlines."""

from __future__ import annotations

import asyncio

import pytest
from pets_operator.workqueue import CHANGED, TIMER, URGENT, WorkQueue

pytestmark = pytest.mark.unit


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 5))


def test_a_key_added_many_times_waits_once() -> None:
    async def main() -> list[object]:
        q = WorkQueue()
        for _ in range(100):
            q.add("a")
        q.add("b")
        assert len(q) == 2
        return [await q.get(), await q.get()]

    assert run(main()) == ["a", "b"]


def test_new_trainings_go_ahead_of_changes_and_changes_ahead_of_timers() -> None:
    async def main() -> list[object]:
        q = WorkQueue()
        q.add("resync", TIMER)
        q.add("pod-changed", CHANGED)
        q.add("created", URGENT)
        q.add("resync-now-changed", TIMER)
        q.add("resync-now-changed", CHANGED)  # a better priority moves it up, once
        return [await q.get() for _ in range(4)]

    assert run(main()) == ["created", "pod-changed", "resync-now-changed", "resync"]


def test_a_key_is_never_handed_out_twice_at_once_and_comes_back_when_done() -> None:
    async def main() -> None:
        q = WorkQueue()
        q.add("a")
        assert await q.get() == "a"
        q.add("a")  # changed while a worker holds it
        assert len(q) == 0
        getter = asyncio.ensure_future(q.get())
        await asyncio.sleep(0.05)
        assert not getter.done()  # not a second time meanwhile
        q.done("a")
        assert await getter == "a"  # once more after done: the change is not lost
        q.done("a")
        assert len(q) == 0

    run(main())


def test_deadlines_add_the_key_and_the_earliest_wins() -> None:
    now = [0.0]

    async def main() -> None:
        q = WorkQueue(clock=lambda: now[0])
        timers = asyncio.ensure_future(q.run_timers())
        q.add_after("a", 30)
        q.add_after("a", 10)  # earlier: wins
        q.add_after("a", 20)  # later: ignored
        q.add_after("b", 15)
        await asyncio.sleep(0.01)
        assert len(q) == 0
        now[0] = 10.0
        q.add_after("c", 100)  # any change of the timers wakes the timer task
        await asyncio.sleep(0.01)
        assert await q.get() == "a"
        q.done("a")
        now[0] = 31.0
        q.add_after("e", 1000)  # (a fake clock: wake the timer task by hand)
        await asyncio.sleep(0.01)
        assert await q.get() == "b"  # "a" came once: its 20 and 30 were superseded
        q.done("b")
        assert len(q) == 0
        q.forget("c")
        q.forget("e")
        now[0] = 1000.0
        q.add_after("d", 0)
        await asyncio.sleep(0.01)
        assert await q.get() == "d"  # "c" was forgotten
        assert len(q) == 0
        timers.cancel()

    run(main())


def test_a_round_that_runs_clears_the_deadline_it_was_due_for() -> None:
    async def main() -> None:
        q = WorkQueue()
        q.add_after("a", 3600)
        q.add("a")  # an event came first
        assert await q.get() == "a"
        q.done("a")
        q.add_after("a", 7200)  # the round's own next deadline is kept, not the old one
        assert q._deadlines["a"] > 3600  # noqa: SLF001

    run(main())


def test_a_change_waits_its_window_and_keeps_its_priority_over_timers() -> None:
    now = [0.0]

    async def main() -> None:
        q = WorkQueue(clock=lambda: now[0])
        timers = asyncio.ensure_future(q.run_timers())
        q.add_after("resync", 0.5)  # a deadline, due first
        q.add_after("pod-changed", 1.0, CHANGED)  # a change in its window
        q.add_after("pod-changed", 1.0, CHANGED)  # the same burst: one round
        now[0] = 2.0
        q.add_after("wake", 100)  # (a fake clock: wake the timer task by hand)
        await asyncio.sleep(0.01)
        assert await q.get() == "pod-changed"  # both due: the change first
        assert await q.get() == "resync"
        assert len(q) == 0
        timers.cancel()

    run(main())
