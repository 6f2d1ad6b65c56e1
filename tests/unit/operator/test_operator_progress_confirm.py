"""One failed read of rank 0's gauges says nothing: a rank 0 that has just finished closes its endpoint a
few seconds before its pod ends, and a short training must not end with ProgressReported=False (issue 21).
Status speaks once reads have failed for PROGRESS_CONFIRM_SECONDS (a second scrape)."""

from __future__ import annotations

import asyncio
import socket
from datetime import UTC, datetime, timedelta

import pytest
from aiohttp import web
from pets_operator import plan_types, stall
from pets_operator.scraper import Scraper, ScrapeTarget, client_session
from test_operator_scraper_hostile import _plan

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)  # _plan's now
ERROR = "http://10.0.0.5:9090/metrics: cannot connect: Connection refused"


def plan(failing_for: float) -> plan_types.Plan:
    """A running training's plan 60 s after rank 0 started (past the grace), its reads failing so long."""
    return _plan(None, ERROR, failing_since=NOW - timedelta(seconds=failing_for), unreachable=True)


def reported(p: plan_types.Plan) -> dict[str, object] | None:
    return next((c for c in p.status.conditions if c["type"] == "ProgressReported"), None)


def test_a_first_failed_read_says_nothing_and_looks_again_after_the_next_scrape() -> None:
    p = plan(failing_for=3.0)
    assert reported(p) is None and p.events == []
    assert p.requeue_after == pytest.approx(stall.PROGRESS_CONFIRM_SECONDS - 3.0)


def test_reads_failing_past_the_confirmation_are_said() -> None:
    p = plan(failing_for=stall.PROGRESS_CONFIRM_SECONDS + 1)
    cond = reported(p)
    assert cond is not None and cond["status"] == "False" and cond["reason"] == "EndpointUnreachable"
    assert [e.reason for e in p.events] == ["ProgressUnreadable"]


def test_the_scraper_keeps_when_a_pods_reads_began_to_fail_until_one_succeeds() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed: connections are refused

    async def main() -> list[datetime | None]:
        seen: list[datetime | None] = []
        targets = [ScrapeTarget("k", "uid", "127.0.0.1")]
        scraper = Scraper(port, 10.0, 4, 2.0, lambda: targets, lambda _k: None)
        async with client_session(2.0, 4) as session:
            for _ in range(2):
                await scraper.one_pass(session)
                reading = scraper.reading("k", "uid")
                assert reading is not None and reading.error is not None
                seen.append(reading.failing_since)
                await asyncio.sleep(0.05)

            async def metrics(_request: web.Request) -> web.Response:
                return web.Response(text="pets_step 3\n")

            app = web.Application()
            app.router.add_get("/metrics", metrics)
            runner = web.AppRunner(app, handle_signals=False)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            try:
                await scraper.one_pass(session)
            finally:
                await runner.cleanup()
            ok = scraper.reading("k", "uid")
            assert ok is not None and ok.error is None
            seen.append(ok.failing_since)
        return seen

    first, second, after_success = asyncio.run(asyncio.wait_for(main(), 30))
    assert first is not None and second == first  # the second failure keeps the first's time
    assert after_success is None
