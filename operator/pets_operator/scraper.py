"""Rank 0's progress, read off the reconcile path: one pass over every running training per interval,
at most `concurrency` reads in flight, each bounded by `timeout`.

A pass reads each target's `http://<pod IP>:<port>/metrics` (docs/contract.md) and keeps the last
reading per training. Only a reading that differs from the one before (other gauges, or readable
turned unreadable, or another pod) wakes that training's reconciliation, so 1000 trainings whose
numbers stand still cost 1000 GETs to the pods per pass and nothing to the API server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

import aiohttp

from pets_operator import metrics
from pets_operator.progress import parse_progress

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    key: Hashable  # the training (namespace, name)
    pod_uid: str  # rank 0's pod: a reading belongs to this very pod
    ip: str


@dataclass(frozen=True)
class Reading:
    pod_uid: str
    progress: dict[str, float] | None  # None: could not be read (see error)
    error: str | None

    def same_as(self, other: Reading | None) -> bool:
        return other is not None and (self.pod_uid, self.progress, self.error is None) == \
            (other.pod_uid, other.progress, other.error is None)


class Scraper:
    def __init__(self, port: int, interval: float, concurrency: int, timeout: float,
                 targets: Callable[[], Iterable[Target]], changed: Callable[[Hashable], None]) -> None:
        self.port, self.interval, self.concurrency, self.timeout = port, interval, concurrency, timeout
        self.targets, self.changed = targets, changed
        self.readings: dict[Hashable, Reading] = {}

    def reading(self, key: Hashable, pod_uid: str) -> Reading | None:
        """The last reading of this training's rank 0, if it is of this pod."""
        found = self.readings.get(key)
        return found if found is not None and found.pod_uid == pod_uid else None

    def forget(self, key: Hashable) -> None:
        self.readings.pop(key, None)

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        connector = aiohttp.TCPConnector(limit=self.concurrency, force_close=True)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            while True:
                started = time.monotonic()
                await self.one_pass(session)
                metrics.SCRAPE_PASS_SECONDS.observe(time.monotonic() - started)
                await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    async def one_pass(self, session: aiohttp.ClientSession) -> None:
        gate = asyncio.Semaphore(self.concurrency)
        targets = list(self.targets())
        await asyncio.gather(*(self._read(session, gate, t) for t in targets))
        live = {t.key for t in targets}
        for key in [k for k in self.readings if k not in live]:
            del self.readings[key]  # no longer running: the next start is a change again

    async def _read(self, session: aiohttp.ClientSession, gate: asyncio.Semaphore, target: Target) -> None:
        url = f"http://{target.ip}:{self.port}/metrics"
        async with gate:
            try:
                async with session.get(url) as resp:
                    resp.raise_for_status()
                    text = await resp.text(errors="replace")
                reading = Reading(target.pod_uid, parse_progress(text) or None, None)
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                reading = Reading(target.pod_uid, None, f"{url}: {_describe(exc)}")
        metrics.SCRAPES.labels(result="ok" if reading.error is None else "error").inc()
        before = self.readings.get(target.key)
        self.readings[target.key] = reading
        if not reading.same_as(before):
            self.changed(target.key)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__
