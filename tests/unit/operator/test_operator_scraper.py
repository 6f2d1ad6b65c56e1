"""The progress scraper against real endpoints: prometheus_client's server (as the trainer serves its
gauges), a port nobody listens on, and one that accepts and never answers."""

from __future__ import annotations

import asyncio
import selectors
import socket
import threading
from collections.abc import Hashable, Iterator

import aiohttp
import pytest
from pets_operator.scraper import Scraper, ScrapeTarget
from prometheus_client import CollectorRegistry, Gauge, start_http_server

pytestmark = pytest.mark.unit


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def trainer() -> Iterator[tuple[int, dict[str, Gauge]]]:
    registry = CollectorRegistry()
    gauges = {n: Gauge(n, n, registry=registry) for n in ("pets_epoch", "pets_total_epochs", "pets_step")}
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    yield port, gauges
    server.shutdown()
    thread.join(5)


def one_pass(scraper: Scraper) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=scraper.timeout)) as session:
            await scraper.one_pass(session)
    asyncio.run(asyncio.wait_for(main(), 10))


def test_only_a_changed_reading_wakes_the_training(trainer: tuple[int, dict[str, Gauge]]) -> None:
    port, gauges = trainer
    gauges["pets_epoch"].set(1)
    gauges["pets_total_epochs"].set(3)
    woken: list[Hashable] = []
    targets = [ScrapeTarget(("ns", "a"), "uid-a", "127.0.0.1")]
    scraper = Scraper(port, 10.0, 4, 2.0, lambda: targets, woken.append)
    one_pass(scraper)
    assert woken == [("ns", "a")]
    reading = scraper.reading(("ns", "a"), "uid-a")
    assert reading is not None and reading.progress is not None and reading.error is None
    assert reading.progress["pets_epoch"] == 1 and reading.progress["pets_total_epochs"] == 3
    assert scraper.reading(("ns", "a"), "another-pod") is None  # a reading belongs to its pod
    one_pass(scraper)
    assert woken == [("ns", "a")]  # nothing moved: nothing to reconcile
    gauges["pets_step"].set(5)
    one_pass(scraper)
    assert woken == [("ns", "a")] * 2
    targets.clear()
    one_pass(scraper)
    assert scraper.readings == {}  # not running any more: forgotten


class SilentServer:
    """Accepts connections and never answers; counts how many are open at once (a client that gives up
    closes its end, which the server sees as end of file)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(100)
        self.port = int(self.sock.getsockname()[1])
        self.most_open = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self.sock, selectors.EVENT_READ)
            open_conns = 0
            while not self._stop.is_set():
                for key, _ in sel.select(0.05):
                    if key.fileobj is self.sock:
                        conn, _ = self.sock.accept()
                        sel.register(conn, selectors.EVENT_READ)
                        open_conns += 1
                        self.most_open = max(self.most_open, open_conns)
                    elif not key.fileobj.recv(65536):  # type: ignore[union-attr]
                        sel.unregister(key.fileobj)
                        key.fileobj.close()  # type: ignore[union-attr]
                        open_conns -= 1
            for key in list(sel.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def test_unreachable_and_silent_endpoints_are_errors_bounded_by_the_timeout() -> None:
    silent = SilentServer()
    woken: list[Hashable] = []
    targets = [ScrapeTarget(("ns", f"t{i}"), f"u{i}", "127.0.0.1") for i in range(20)]
    scraper = Scraper(silent.port, 10.0, 20, 2.0, lambda: targets, woken.append)
    try:
        one_pass(scraper)  # (bounded at 10 s: twenty reads one after the other would take 40)
    finally:
        silent.close()
    assert sorted(woken) == sorted(t.key for t in targets)
    for t in targets:
        reading = scraper.readings[t.key]
        assert reading.progress is None and reading.error and "timed out" in reading.error
    # In parallel, up to the concurrency: all twenty were waiting at once, so a pass takes one timeout.
    assert silent.most_open == 20, silent.most_open

    refused = Scraper(free_port(), 10.0, 4, 2.0, lambda: targets[:1], woken.append)
    one_pass(refused)
    error = refused.readings[("ns", "t0")].error
    assert error and error.startswith("http://127.0.0.1:") and "/metrics" in error
