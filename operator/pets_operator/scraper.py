"""Rank 0's progress, read off the reconcile path: one pass over every running training per interval,
at most `concurrency` reads in flight, each bounded by `timeout`.

A pass reads each target's `http://<pod IP>:<port>/metrics` (docs/contract.md) and keeps the last
reading per training. Only a reading that differs from the one before (other gauges, or readable
turned unreadable, or another pod) wakes that training's reconciliation, so 1000 trainings whose
numbers stand still cost 1000 GETs to the pods per pass and nothing to the API server.

Nothing a pod sends can hurt the operator: a read follows no redirect, asks for and accepts only an
uncompressed body (no gzip bomb), takes at most `BODY_CAP` bytes within `timeout`, and keeps no cookies;
the numbers are checked (`progress.check_progress`) before they can reach a status. A failed read's error
names the kind of failure (`redirect refused`, `HTTP status 500`, `response over 256 KiB`,
`value out of range: imagesPerSecond`) and never quotes what the pod sent, since it goes into the
training's conditions and Events.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import aiohttp

from pets_operator import metrics
from pets_operator.progress import ProgressError, parse_progress

log = logging.getLogger(__name__)

# The trainer's endpoint with every gauge set is about 1.3 KiB: 256 KiB is 200 times that, and bounds
# both the memory a read takes and the parse (which runs on the event loop; see progress.py).
BODY_CAP = 256 * 1024
OVER_CAP = f"response over {BODY_CAP // 1024} KiB"
REQUEST_HEADERS = {"Accept-Encoding": "identity", "Accept": "text/plain"}


class Refused(Exception):
    """A response the scraper does not read on; the message is the kind of refusal."""


@dataclass(frozen=True)
class ScrapeTarget:
    """Rank 0's progress endpoint: the training it is of, its pod, and the pod's address."""

    key: Hashable  # the training (namespace, name)
    pod_uid: str  # rank 0's pod: a reading belongs to this very pod
    ip: str


@dataclass(frozen=True)
class Reading:
    pod_uid: str
    progress: dict[str, float] | None  # None: could not be read (see error)
    error: str | None
    unreachable: bool = False  # the error: rank 0 could not be reached at all (else it answered, refused)
    # Since when this pod's reads have failed without a success between (a pod shutting down fails one
    # read; status waits for a second before it says so).
    failing_since: datetime | None = None
    at: datetime | None = None  # when it was read: a status another replica wrote may be newer

    def same_as(self, other: Reading | None) -> bool:
        return other is not None and (self.pod_uid, self.progress, self.error is None) == \
            (other.pod_uid, other.progress, other.error is None)


class Scraper:
    def __init__(self, port: int, interval: float, concurrency: int, timeout: float,
                 targets: Callable[[], Iterable[ScrapeTarget]], changed: Callable[[Hashable], None]) -> None:
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
        async with client_session(self.timeout, self.concurrency) as session:
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

    async def _read(self, session: aiohttp.ClientSession, gate: asyncio.Semaphore,
                    target: ScrapeTarget) -> None:
        url = f"http://{target.ip}:{self.port}/metrics"
        async with gate:
            try:
                body = await fetch(session, url, self.timeout)
                # Parsed here, on the loop: the body is at most BODY_CAP, and only its pets_* lines (at
                # most 16 KiB) reach the Prometheus parser, a few ms at worst (progress.py).
                progress = parse_progress(body.decode("utf-8", "replace"))
                reading = Reading(target.pod_uid, progress or None, None, at=datetime.now(UTC))
            except Exception as exc:  # any failure is this training's reading, never the whole pass's
                words, unreachable = _describe(exc)
                reading = Reading(target.pod_uid, None, f"{url}: {words}", unreachable, at=datetime.now(UTC))
        metrics.SCRAPES.labels(result="ok" if reading.error is None else "error").inc()
        before = self.readings.get(target.key)
        if reading.error is not None:
            still = before is not None and before.error is not None and before.pod_uid == reading.pod_uid
            since = before.failing_since if still and before is not None else None
            reading = replace(reading, failing_since=since or datetime.now(UTC))
        self.readings[target.key] = reading
        if not reading.same_as(before):
            self.changed(target.key)


def client_session(timeout: float, concurrency: int) -> aiohttp.ClientSession:
    """The scraper's session: no cookie jar (a pod cannot grow the operator's memory with cookies), no
    decompression, no proxy from the environment; `fetch` sets the per-read bounds again itself."""
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout),
        connector=aiohttp.TCPConnector(limit=concurrency, force_close=True),
        auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False)


async def fetch(session: aiohttp.ClientSession, url: str, timeout: float) -> bytes:
    """The body of one GET of `url`, within `timeout` seconds: 200 only, no redirect followed, no
    Content-Encoding but identity, at most `BODY_CAP` bytes. Anything else raises `Refused`."""
    async with session.get(url, allow_redirects=False, auto_decompress=False, headers=REQUEST_HEADERS,
                           timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        if 300 <= resp.status < 400:
            raise Refused("redirect refused")
        if resp.status != 200:
            raise Refused(f"HTTP status {resp.status}")
        encodings = resp.headers.getall("Content-Encoding", [])
        codings = {c.strip().lower() for value in encodings for c in value.split(",")}
        if codings - {"", "identity"}:
            raise Refused("compressed response refused")
        if resp.content_length is not None and resp.content_length > BODY_CAP:
            raise Refused(OVER_CAP)
        body = bytearray()
        while chunk := await resp.content.read(BODY_CAP + 1 - len(body)):
            body += chunk
            if len(body) > BODY_CAP:
                raise Refused(OVER_CAP)  # leaving the block closes the connection: the rest is never read
        return bytes(body)


def _describe(exc: BaseException) -> tuple[str, bool]:
    """The kind of failure, in the operator's own words (aiohttp's and the parser's messages can quote the
    response: a bad status line, a bad header, a bad line; and this text goes into status and Events), and
    whether rank 0 could not be reached at all (else it answered with something refused)."""
    if isinstance(exc, Refused | ProgressError):
        return str(exc), False
    if isinstance(exc, TimeoutError):  # aiohttp's timeouts are TimeoutErrors too
        return "timed out", True
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect: {_os_reason(exc)}", True
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server disconnected", True
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "malformed response body", False
    if isinstance(exc, aiohttp.ClientResponseError):
        return "malformed HTTP response", False
    if isinstance(exc, OSError):
        return f"connection error: {_os_reason(exc)}", True
    return f"read failed ({type(exc).__name__})", False


def _os_reason(exc: OSError) -> str:
    return os.strerror(exc.errno) if exc.errno else type(exc).__name__
