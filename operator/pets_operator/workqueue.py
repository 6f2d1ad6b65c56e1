"""A work queue of PetsTraining keys, as controllers keep one (client-go's workqueue semantics).

- A key waits in the queue at most once, however often it is added (events coalesce).
- A key is never handed to two workers at once: one added while a worker holds it comes back after
  `done`.
- Priorities: a new training (URGENT) goes ahead of a changed child (CHANGED), which goes ahead of a
  deadline or resync (TIMER), so 1000 creates never wait behind 1000 pod updates.
- `add_after` keeps one deadline per key (the earliest wins, with the best priority asked for; a
  fresh `add_after` after `done` replaces it), run by one timer task, not one sleeping task per
  training.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Callable, Hashable

URGENT, CHANGED, TIMER = 0, 1, 2


class WorkQueue:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._ready: list[tuple[int, int, Hashable]] = []  # (priority, order, key)
        self._queued: dict[Hashable, int] = {}  # key -> priority it waits with
        self._active: set[Hashable] = set()  # handed to a worker, not done yet
        self._again: dict[Hashable, int] = {}  # added while active: re-queue at done, with this priority
        self._deadlines: dict[Hashable, float] = {}  # key -> when the timer adds it
        self._due_priority: dict[Hashable, int] = {}  # key -> the priority it is added with then
        self._timers: list[tuple[float, int, Hashable]] = []
        self._order = itertools.count()
        self._wakeup = asyncio.Event()
        self._timer_changed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._queued)

    def add(self, key: Hashable, priority: int = CHANGED) -> None:
        if key in self._active:
            self._again[key] = min(priority, self._again.get(key, priority))
            return
        if key in self._queued and self._queued[key] <= priority:
            return
        self._queued[key] = priority  # a better priority: its older entry is skipped when popped
        heapq.heappush(self._ready, (priority, next(self._order), key))
        self._wakeup.set()

    def add_after(self, key: Hashable, delay: float, priority: int = TIMER) -> None:
        """Add the key in `delay` seconds (with `priority` then), unless it is due sooner already."""
        when = self._clock() + max(0.0, delay)
        self._due_priority[key] = min(priority, self._due_priority.get(key, priority))
        if self._deadlines.get(key, float("inf")) <= when:
            return
        self._deadlines[key] = when
        heapq.heappush(self._timers, (when, next(self._order), key))
        self._timer_changed.set()

    def forget(self, key: Hashable) -> None:
        """Drop the key's deadline (the training is gone); a queued add still runs, and finds it gone."""
        self._deadlines.pop(key, None)
        self._due_priority.pop(key, None)

    async def get(self) -> Hashable:
        while True:
            while self._ready:
                priority, _, key = heapq.heappop(self._ready)
                if self._queued.get(key) != priority:
                    continue  # superseded by a better-priority add, or already taken
                del self._queued[key]
                self._active.add(key)
                self._deadlines.pop(key, None)  # the round it was due for runs now
                self._due_priority.pop(key, None)
                return key
            self._wakeup.clear()
            await self._wakeup.wait()

    def done(self, key: Hashable) -> None:
        self._active.discard(key)
        if key in self._again:
            self.add(key, self._again.pop(key))

    async def run_timers(self) -> None:
        """Add each key when its deadline comes; runs for the operator's life."""
        while True:
            now = self._clock()
            while self._timers and self._timers[0][0] <= now:
                when, _, key = heapq.heappop(self._timers)
                if self._deadlines.get(key) == when:
                    del self._deadlines[key]
                    self.add(key, self._due_priority.pop(key, TIMER))
            self._timer_changed.clear()
            timeout = self._timers[0][0] - now if self._timers else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._timer_changed.wait(), timeout)
