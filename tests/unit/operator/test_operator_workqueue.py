"""The operator's work queue: coalescing, one worker per key, priorities, deadlines.

Deadlines run on a fake clock (`WorkQueue(clock=...)`): a test moves the time and wakes the timer task
by hand, then waits until that task has gone through its timers once. No assertion reads the real
clock, and none waits a real duration.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

import pytest
from pets_operator.workqueue import CHANGED, TIMER, URGENT, WorkQueue

pytestmark = pytest.mark.unit


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 5))  # a bound on a bug, never on a measurement


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def settle() -> None:
    """Let every task that can run, run (a ready `get` returns within one step)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def advance(q: WorkQueue, clock: FakeClock, to: float) -> None:
    """Move the fake clock to `to` and let the timer task go through its deadlines once."""
    clock.now = to
    q._timer_changed.set()  # noqa: SLF001 (the fake clock does not wake the timer task itself)
    while q._timer_changed.is_set():  # noqa: SLF001 (the timer task clears it after its pass)
        await asyncio.sleep(0)


async def drain(q: WorkQueue) -> list[Hashable]:
    """Every key ready now, in the order workers get them (each one done at once)."""
    out = []
    while len(q):
        key = await q.get()
        q.done(key)
        out.append(key)
    return out


def with_timers(test: Callable[[WorkQueue, FakeClock], Awaitable[None]]) -> None:
    async def main() -> None:
        clock = FakeClock()
        q = WorkQueue(clock=clock)
        timers = asyncio.ensure_future(q.run_timers())
        await settle()
        try:
            await test(q, clock)
        finally:
            timers.cancel()

    run(main())


# (a) Coalescing: a key waits in the queue at most once, with the best priority it was added with.

def test_a_key_added_many_times_waits_once() -> None:
    async def main() -> None:
        q = WorkQueue()
        for _ in range(100):
            q.add("a")
        q.add("b")
        assert len(q) == 2
        assert await drain(q) == ["a", "b"]
        getter = asyncio.ensure_future(q.get())
        await settle()
        assert not getter.done()  # no second "a" was left behind
        getter.cancel()

    run(main())


def test_a_better_priority_moves_a_waiting_key_up_once_and_a_worse_one_does_not_move_it() -> None:
    async def main() -> None:
        q = WorkQueue()
        q.add("x", TIMER)
        q.add("y", CHANGED)
        q.add("x", URGENT)  # better: ahead of y now
        q.add("x", TIMER)  # worse: x keeps URGENT
        q.add("y", TIMER)  # worse: y keeps CHANGED
        q.add("z", CHANGED)
        assert len(q) == 3
        assert await drain(q) == ["x", "y", "z"]  # x once: its older TIMER entry is not handed out
        getter = asyncio.ensure_future(q.get())
        await settle()
        assert not getter.done()
        getter.cancel()

    run(main())


def test_a_superseded_entry_lends_its_priority_to_no_later_add() -> None:
    async def main() -> None:
        q = WorkQueue()
        q.add("x", CHANGED)
        q.add("x", URGENT)  # x moves up; its CHANGED entry is left behind, superseded
        assert await q.get() == "x"
        q.done("x")
        q.add("y", TIMER)
        q.add("x", TIMER)  # a resync: behind y, not ahead of it as the old CHANGED entry was
        assert await drain(q) == ["y", "x"]

    run(main())


def test_new_trainings_go_ahead_of_changes_and_changes_ahead_of_timers() -> None:
    async def main() -> list[Hashable]:
        q = WorkQueue()
        q.add("resync", TIMER)
        q.add("pod-changed", CHANGED)
        q.add("created", URGENT)
        q.add("resync-now-changed", TIMER)
        q.add("resync-now-changed", CHANGED)  # a better priority moves it up, once
        return await drain(q)

    assert run(main()) == ["created", "pod-changed", "resync-now-changed", "resync"]


# (b) One worker per key: added while a worker holds it, it comes back after `done`, not before.

def test_a_key_is_never_handed_out_twice_at_once_and_comes_back_when_done() -> None:
    async def main() -> None:
        q = WorkQueue()
        q.add("a")
        assert await q.get() == "a"
        q.add("a")  # changed while a worker holds it
        q.add("a")  # (twice: still one more round)
        assert len(q) == 0
        getter = asyncio.ensure_future(q.get())
        await settle()
        assert not getter.done()  # no second worker gets it meanwhile
        q.done("a")
        assert await getter == "a"  # once more after done: the change is not lost
        q.done("a")
        assert len(q) == 0  # and only once more

    run(main())


def test_a_held_key_comes_back_with_the_best_priority_it_was_added_with_meanwhile() -> None:
    async def main() -> None:
        q = WorkQueue()
        q.add("a")
        assert await q.get() == "a"
        q.add("a", URGENT)  # a new spec while a worker holds the key...
        q.add("a", TIMER)  # ...then a resync: the URGENT stands
        q.add("b", CHANGED)
        q.done("a")
        assert await drain(q) == ["a", "b"]

    run(main())


def test_a_key_not_held_when_done_is_called_is_not_queued() -> None:
    async def main() -> None:
        q = WorkQueue()
        q.add("a")
        assert await q.get() == "a"
        q.done("a")
        q.done("a")
        assert len(q) == 0

    run(main())


# (c) add_after: one deadline per key, the earliest wins; the timer adds the key then.

def test_the_earliest_deadline_wins() -> None:
    async def test(q: WorkQueue, clock: FakeClock) -> None:
        q.add_after("a", 30)
        q.add_after("a", 10)  # earlier: wins
        q.add_after("a", 20)  # later: ignored
        q.add_after("b", 15)
        await advance(q, clock, 9.9)
        assert len(q) == 0  # nothing is due before 10
        await advance(q, clock, 10.0)
        assert await drain(q) == ["a"]
        await advance(q, clock, 15.0)
        assert await drain(q) == ["b"]
        await advance(q, clock, 31.0)
        assert len(q) == 0  # "a" came once: its 20 and 30 were superseded

    with_timers(test)


def test_a_forgotten_key_is_not_added_by_its_deadline() -> None:
    async def test(q: WorkQueue, clock: FakeClock) -> None:
        q.add_after("gone", 10)
        q.add_after("kept", 10)
        q.forget("gone")
        await advance(q, clock, 10.0)
        assert await drain(q) == ["kept"]

    with_timers(test)


def test_a_deadline_in_the_past_is_due_at_once() -> None:
    async def test(q: WorkQueue, clock: FakeClock) -> None:
        clock.now = 100.0
        q.add_after("a", -5)
        await advance(q, clock, 100.0)
        assert await drain(q) == ["a"]

    with_timers(test)


# (d) A round that runs clears the deadline it was due for: the next add_after is the new deadline.

def test_a_round_that_runs_clears_the_deadline_it_was_due_for() -> None:
    async def test(q: WorkQueue, clock: FakeClock) -> None:
        q.add_after("a", 10)
        q.add("a")  # an event came first: its round runs now
        assert await q.get() == "a"
        q.add_after("a", 100)  # the round's own next deadline, later than the old one
        q.done("a")
        await advance(q, clock, 10.0)
        assert len(q) == 0  # the old deadline went with the round it was due for
        await advance(q, clock, 99.9)
        assert len(q) == 0
        await advance(q, clock, 100.0)
        assert await drain(q) == ["a"]

    with_timers(test)


def test_a_round_that_runs_clears_the_priority_its_deadline_was_asked_with() -> None:
    async def test(q: WorkQueue, clock: FakeClock) -> None:
        q.add_after("a", 10, CHANGED)
        q.add("a")
        assert await q.get() == "a"
        q.done("a")
        q.add_after("a", 50)  # a plain resync now: TIMER, not the old round's CHANGED
        q.add_after("b", 40)  # due earlier, so ahead of "a" at the same priority
        await advance(q, clock, 50.0)
        assert await drain(q) == ["b", "a"]

    with_timers(test)


# (e) Priorities across add and add_after: the best one asked for wins.

@pytest.mark.parametrize("first, second", [(CHANGED, TIMER), (TIMER, CHANGED)])
def test_a_deadline_keeps_the_best_priority_asked_for(first: int, second: int) -> None:
    """Whichever add_after asked for CHANGED (the earlier deadline or the ignored later one), the key
    comes with CHANGED, ahead of a TIMER key that was due before it."""
    async def test(q: WorkQueue, clock: FakeClock) -> None:
        q.add_after("resync", 1)  # TIMER, due first
        q.add_after("k", 5, first)
        q.add_after("k", 10, second)  # later: its deadline is ignored, its priority is not
        await advance(q, clock, 5.0)
        assert await drain(q) == ["k", "resync"]

    with_timers(test)


def test_a_due_key_already_waiting_keeps_its_better_priority() -> None:
    async def test(q: WorkQueue, clock: FakeClock) -> None:
        q.add("k", URGENT)
        q.add_after("k", 5)  # TIMER, due while k still waits
        q.add("other", CHANGED)
        await advance(q, clock, 5.0)
        assert len(q) == 2
        assert await drain(q) == ["k", "other"]

    with_timers(test)


def test_a_due_deadline_moves_a_waiting_key_up() -> None:
    async def test(q: WorkQueue, clock: FakeClock) -> None:
        q.add("k", TIMER)
        q.add("other", CHANGED)
        q.add_after("k", 5, URGENT)
        await advance(q, clock, 5.0)
        assert await drain(q) == ["k", "other"]

    with_timers(test)


def test_a_change_waits_its_window_and_keeps_its_priority_over_timers() -> None:
    async def test(q: WorkQueue, clock: FakeClock) -> None:
        q.add_after("resync", 0.5)  # a deadline, due first
        q.add_after("pod-changed", 1.0, CHANGED)  # a change in its window
        q.add_after("pod-changed", 1.0, CHANGED)  # the same burst: one round
        await advance(q, clock, 2.0)
        assert await drain(q) == ["pod-changed", "resync"]  # both due: the change first

    with_timers(test)
