"""The progress scraper against real endpoints: prometheus_client's server (as the trainer serves its
gauges), a port nobody listens on, and one that accepts and never answers."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Hashable, Iterator

import aiohttp
import pytest
from pets_operator.scraper import Scraper, Target
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
    targets = [Target(("ns", "a"), "uid-a", "127.0.0.1")]
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


def test_unreachable_and_silent_endpoints_are_errors_bounded_by_the_timeout() -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(100)  # accepts (the kernel does), never answers
    woken: list[Hashable] = []
    targets = [Target(("ns", f"t{i}"), f"u{i}", "127.0.0.1") for i in range(20)]
    scraper = Scraper(silent.getsockname()[1], 10.0, 20, 0.5, lambda: targets, woken.append)
    loop_time = asyncio.new_event_loop()
    started = loop_time.time()
    one_pass(scraper)
    took = loop_time.time() - started
    loop_time.close()
    silent.close()
    assert sorted(woken) == sorted(t.key for t in targets)
    for t in targets:
        reading = scraper.readings[t.key]
        assert reading.progress is None and reading.error and "timed out" in reading.error
    assert took < 5, took  # 20 reads in parallel, each cut at 0.5 s: one timeout, not twenty

    refused = Scraper(free_port(), 10.0, 4, 2.0, lambda: targets[:1], woken.append)
    one_pass(refused)
    error = refused.readings[("ns", "t0")].error
    assert error and error.startswith("http://127.0.0.1:") and "/metrics" in error
