"""Nothing a training pod sends can hurt the operator (issue 28): the scraper against real hostile HTTP
servers on 127.0.0.1 (aiohttp.web and raw asyncio sockets, nothing mocked), and the checks every gauge
passes before it can reach a status."""

from __future__ import annotations

import asyncio
import json
import math
import random
import resource
import socket
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest
from aiohttp import web
from operator_specs import mirror_into  # tests/unit/operator/operator_specs.py
from pets_operator import api, backends, builders, children, plan_types
from pets_operator import plan as planner
from pets_operator.plan_types import Round
from pets_operator.progress import PETS_TEXT_CAP, ProgressError, check_progress, parse_progress
from pets_operator.scraper import (
    BODY_CAP,
    OVER_CAP,
    Reading,
    Refused,
    Scraper,
    ScrapeTarget,
    _describe,
    client_session,
)
from pets_operator.status_types import Status
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from pets_contract import gauges

pytestmark = pytest.mark.unit

TOKEN = "SECRET-7f3a9c-TOKEN"  # what a hostile pod would like to see echoed into status and Events
KEY = ("ns", "pets")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serve(handler: Handler) -> AsyncIterator[int]:
    """An aiohttp.web server on a free 127.0.0.1 port answering /metrics (and anything else) with handler."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    assert runner.addresses
    try:
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()


@asynccontextmanager
async def serve_raw(answer: bytes) -> AsyncIterator[int]:
    """A TCP server that reads the request and writes `answer`, byte for byte, whatever it is."""
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(reply, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()


async def scrape(port: int, timeout: float = 2.0) -> Reading:
    """One pass of the operator's own scraper, with its own session, over one target."""
    targets = [ScrapeTarget(KEY, "uid", "127.0.0.1")]
    scraper = Scraper(port, 10.0, 4, timeout, lambda: targets, lambda _k: None)
    async with client_session(timeout, 4) as session:
        await scraper.one_pass(session)
    reading = scraper.reading(KEY, "uid")
    assert reading is not None
    return reading


def run(main: Callable[[], Awaitable[Reading]]) -> Reading:
    return asyncio.run(asyncio.wait_for(main(), 30))


def assert_error(reading: Reading, *kinds: str) -> None:
    """An error reading of one of these kinds, prefixed with the URL only, and no trace of the token."""
    assert reading.progress is None and reading.error is not None, reading
    assert reading.error.startswith("http://127.0.0.1:"), reading.error
    assert any(reading.error.endswith(f"/metrics: {kind}") for kind in kinds), reading.error
    assert TOKEN not in repr(reading)


# A gzip bomb: 1 MiB of gzip that inflates to 1 GiB (aiohttp would inflate it, whole, into memory).
@pytest.fixture(scope="module")
def bomb() -> bytes:
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip framing
    zeros = b"\0" * (1 << 20)
    parts = [deflate.compress(zeros) for _ in range(1024)]
    parts.append(deflate.flush())
    data = b"".join(parts)
    assert len(data) < 2 << 20 and len(zlib.decompressobj(31).decompress(data[:4096], 1 << 20)) == 1 << 20
    return data


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


@pytest.mark.parametrize(("headers", "length", "kind"), [
    ({"Content-Encoding": "gzip"}, False, "compressed response refused"),
    ({"Content-Encoding": "identity, GZIP"}, False, "compressed response refused"),
    ({"Content-Encoding": "br"}, True, "compressed response refused"),
    ({}, False, f"response over {BODY_CAP // 1024} KiB"),  # the same bytes, not said to be gzip: too long
    ({}, True, "response over 256 KiB"),  # and refused from its Content-Length alone
])
def test_a_gzip_bomb_is_neither_inflated_nor_read_whole(bomb: bytes, headers: dict[str, str], length: bool,
                                                         kind: str) -> None:
    asked: list[str] = []
    sent: list[int] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        asked.append(request.headers.get("Accept-Encoding", ""))
        resp = web.StreamResponse(headers=headers)
        if length:
            resp.content_length = len(bomb)
        await resp.prepare(request)
        try:
            for at in range(0, len(bomb), 64 * 1024):
                await resp.write(bomb[at:at + 64 * 1024])
                sent.append(64 * 1024)
        except (ConnectionError, RuntimeError):
            pass  # the scraper hung up: what this test wants
        return resp

    async def main() -> Reading:
        async with serve(handler) as port:
            return await scrape(port)

    before = peak_rss_mb()
    reading = run(main)
    grew = peak_rss_mb() - before
    assert_error(reading, kind)
    assert kind.endswith("KiB") or "compressed" in kind
    assert asked == ["identity"]  # it asked for no compression at all
    assert grew < 100, f"peak RSS grew by {grew:.0f} MB"


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_is_refused_and_never_followed(code: int) -> None:
    hits: list[str] = []

    async def secret(request: web.Request) -> web.StreamResponse:
        hits.append(request.path)
        return web.Response(text=f"# HELP pets_epoch {TOKEN}\npets_epoch 1\n{TOKEN}{{{{\n")

    async def main() -> Reading:
        async with serve(secret) as other:
            async def redirect(request: web.Request) -> web.StreamResponse:
                return web.Response(status=code, reason=TOKEN, text=TOKEN,
                                    headers={"Location": f"http://127.0.0.1:{other}/secret?{TOKEN}"})
            async with serve(redirect) as port:
                return await scrape(port)

    reading = run(main)
    assert_error(reading, "redirect refused")
    assert hits == []  # the second server got no request


@pytest.mark.parametrize("code", [204, 404, 500, 503])
def test_another_status_is_named_by_its_code_only(code: int) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(status=code, reason=TOKEN, text="" if code == 204 else f"pets_epoch 1\n{TOKEN}")

    async def main() -> Reading:
        async with serve(handler) as port:
            return await scrape(port)

    assert_error(run(main), f"HTTP status {code}")


def test_an_endless_body_is_cut_at_the_cap() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        line = b"pets_epoch 1\n" * 5000
        try:
            while True:
                await resp.write(line)
        except (ConnectionError, RuntimeError):
            return resp

    async def main() -> Reading:
        async with serve(handler) as port:
            return await scrape(port)

    assert_error(run(main), "response over 256 KiB")


@pytest.mark.parametrize("endless", [False, True])
def test_a_dripped_body_is_cut_by_the_timeout(endless: bool) -> None:
    """One byte every 50 ms: a body that would take forever (or, short, far longer than the timeout)."""
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        if not endless:
            resp.content_length = 1000
        await resp.prepare(request)
        try:
            for _ in range(10**9 if endless else 1000):
                await resp.write(b"#")
                await asyncio.sleep(0.05)
        except (ConnectionError, RuntimeError):
            pass
        return resp

    async def main() -> Reading:
        async with serve(handler) as port:
            return await scrape(port, timeout=1.0)  # run() bounds the whole read at 30 s

    assert_error(run(main), "timed out")


@pytest.mark.parametrize(("answer", "kind"), [
    (f"HTTP/1.1 {TOKEN}\r\n\r\n".encode(), "malformed HTTP response"),
    (f"HTTP/1.1 200 OK\r\n{TOKEN}\r\n\r\n".encode(), "malformed HTTP response"),
    (f"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\npets_epoch 1\n{TOKEN}".encode(),
     "malformed response body"),
    # a bad chunk: aiohttp finds it while parsing the head or while reading the body, as it arrives
    (f"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz{TOKEN}\r\n".encode(),
     "malformed response body|malformed HTTP response"),
    (b"", "server disconnected"),
    (TOKEN.encode() * 100, "malformed HTTP response"),
])
def test_a_broken_http_answer_is_named_never_quoted(answer: bytes, kind: str) -> None:
    async def main() -> Reading:
        async with serve_raw(answer) as port:
            return await scrape(port)

    assert_error(run(main), *kind.split("|"))


@pytest.mark.parametrize(("text", "kind"), [
    (f"pets_epoch{{{TOKEN} 1\n", "not Prometheus text format"),
    (f'pets_epoch{{a="{TOKEN}"}} one\n', "not Prometheus text format"),
    ("pets_epoch " + "1" * 20 + " " + TOKEN + "\n", "not Prometheus text format"),
    ("pets_images_per_second inf\n", "value out of range: imagesPerSecond"),
    ("pets_images_per_second +Inf\n", "value out of range: imagesPerSecond"),
    ("pets_train_loss -inf\n", "value out of range: trainLoss"),
    ("pets_eta_seconds 1e400\n", "value out of range: etaSeconds"),
    ("pets_elapsed_seconds -0.5\n", "value out of range: elapsedSeconds"),
    ("pets_eval_accuracy 1.5\n", "value out of range: evalAccuracy"),
    ("pets_step 99999999999999999999999999999\n", "value out of range: step"),  # beyond int64
    ("pets_steps_total 9223372036854775808\n", "value out of range: stepsTotal"),  # int64 max + 1
    ("pets_epoch 2.5\n", "value not an integer: epoch"),
    ("pets_checkpoint_epoch -1\n", "value out of range: lastCheckpoint.epoch"),
    ("pets_epoch 1\n" * (PETS_TEXT_CAP // 13 + 1), "pets_* lines over 16 KiB"),
])
def test_bad_gauges_and_garbage_are_a_reading_error_naming_the_field(text: str, kind: str) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(text=text)

    async def main() -> Reading:
        async with serve(handler) as port:
            return await scrape(port)

    assert_error(run(main), kind)
    with pytest.raises(ProgressError, match=kind.replace("*", r"\*")):
        parse_progress(text)


def test_nan_is_no_value_and_the_good_gauges_still_read() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(text="pets_epoch 2\npets_train_loss NaN\nother_metric inf\nnot_pets {{\n")

    async def main() -> Reading:
        async with serve(handler) as port:
            return await scrape(port)

    reading = run(main)
    assert reading.error is None and reading.progress == {"pets_epoch": 2.0}


def test_the_trainers_real_endpoint_reads_well_within_the_bounds() -> None:
    """Every gauge the trainer serves (pets_contract.gauges), set, through prometheus_client's
    server (which would gzip for a client that accepts gzip): read, uncompressed, and mirrored."""
    registry = CollectorRegistry()
    for gauge in gauges.GAUGES:
        value = 0.875 if gauge.key == "eval_accuracy" else 1234567
        Gauge(gauge.name, gauge.help, registry=registry).set(value)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        reading = run(lambda: scrape(port))
    finally:
        server.shutdown()
        thread.join(5)
    assert reading.error is None and reading.progress is not None
    assert set(reading.progress) == set(gauges.READ) and reading.progress["pets_step"] == 1234567
    mirrored = mirror_into(Status(), progress=reading.progress, now=datetime(2026, 1, 2, tzinfo=UTC))
    assert mirrored.step == 1234567 and mirrored.eval_accuracy == 0.875


def test_check_progress_is_pure_and_bounds_every_field() -> None:
    top = gauges.TOP
    assert check_progress({"pets_step": top, "pets_eval_accuracy": 1, "pets_train_loss": 0.0}) == {
        "pets_step": float(top), "pets_eval_accuracy": 1.0, "pets_train_loss": 0.0}
    assert check_progress({"pets_eta_seconds": math.nan, "other": math.inf}) == {}
    bad: list[tuple[dict[str, object], str]] = [
        ({"pets_step": top + 1}, "value out of range: step"),
        ({"pets_step": 2**70}, "value out of range: step"),
        ({"pets_total_epochs": -1}, "value out of range: totalEpochs"),
        ({"pets_images_per_second": math.inf}, "value out of range: imagesPerSecond"),
        ({"pets_eval_accuracy": 1.0000001}, "value out of range: evalAccuracy"),
        ({"pets_epoch": True}, "value of the wrong type: epoch"),
        ({"pets_epoch": "3"}, "value of the wrong type: epoch"),
        ({"pets_epoch": None}, "value of the wrong type: epoch"),
        ({"pets_steps_total": 0.1}, "value not an integer: stepsTotal"),
    ]
    for raw, kind in bad:
        with pytest.raises(ProgressError, match=f"^{kind}$"):
            check_progress(raw)


def _plan(progress: dict[str, float] | None, error: str | None,
          failing_since: datetime | None = None, unreachable: bool = False) -> plan_types.Plan:
    """A running training's plan fed a reading, 60 s after rank 0 started (past the grace)."""
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    spec = api.resolve_spec({})
    target = builders.Target("pets", "ns")
    workload = children.build_job(spec, target)
    workload["metadata"]["annotations"][api.ANNOTATION_SPEC_DIGEST] = builders.spec_digest(spec)
    workload["status"] = {"active": 1, "ready": 1, "startTime": "2026-01-02T03:00:00Z"}
    job = backends.get("job")
    started = (now - timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%SZ")
    observed = plan_types.Observed(backend=job, workload=workload, service=job.build_service(spec, target),
                               progress=progress, progress_error=error, rank0_running_since=started,
                               progress_failing_since=failing_since, progress_unreachable=unreachable)
    body = {"metadata": {"name": "pets", "namespace": "ns", "generation": 1, "uid": "u1"}, "spec": {},
            "status": {"phase": api.RUNNING}}
    return planner.plan(Round.of(body, spec, observed, target, now))


def test_a_bad_gauge_reaches_status_and_events_as_its_kind_only() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(text=f"# HELP pets_epoch {TOKEN}\npets_epoch 3\npets_images_per_second inf\n")

    async def main() -> Reading:
        async with serve(handler) as port:
            return await scrape(port)

    reading = run(main)
    planned = _plan(reading.progress, reading.error)
    text = json.dumps({"status": planned.status.to_dict(), "events": [e.message for e in planned.events]},
                      allow_nan=False)
    assert "value out of range: imagesPerSecond" in text and TOKEN not in text
    reported = next(c for c in planned.status.conditions if c["type"] == "ProgressReported")
    assert reported["status"] == "False" and "imagesPerSecond" in reported["message"]
    assert planned.status.epoch is None  # nothing of a refused reading is mirrored


# What the fuzz below builds its byte strings from: the format's tokens, the hostile numbers, and noise.
PIECES = [b"pets_epoch", b"pets_step", b"pets_eval_accuracy", b"pets_images_per_second", b"pets_train_loss",
          b"pets_checkpoint_epoch", b"pets_eta_seconds", b"other", b"# TYPE ", b"# HELP ", b" gauge",
          b" counter", b" untyped", b" ", b"\n", b"\t", b"{", b"}", b"=", b'"', b",", b"\\", b"_total",
          b"inf", b"+Inf", b"-Inf", b"nan", b"NaN", b"1e400", b"-1", b"0", b"1", b"0.5", b"2.5", b"1e16",
          b"99999999999999999999999", b"9223372036854775808", b"0x10", b"1_0", b"\xff\xfe", b"\x00",
          TOKEN.encode()]


def test_fuzz_the_parser_and_checks_never_raise_else_and_never_pass_a_bad_value() -> None:
    """hypothesis is not installed: a seeded generator of byte strings instead. Whatever the bytes,
    parse_progress returns checked values or raises ProgressError (never another exception, never a
    message quoting the text), and what it returns mirrors into a status JSON can carry."""
    rng = random.Random(28)
    outcomes = {"ok": 0, "error": 0}
    for _ in range(3000):
        if rng.random() < 0.2:
            data = rng.randbytes(rng.randrange(200))
        else:
            data = b"".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 40)))
        text = data.decode("utf-8", "replace")
        try:
            values = parse_progress(text)
        except ProgressError as exc:
            outcomes["error"] += 1
            assert TOKEN not in str(exc) and "\n" not in str(exc)
            continue
        outcomes["ok"] += 1
        for metric, value in values.items():
            kind, top = gauges.READ[metric].kind, gauges.READ[metric].top
            assert type(value) is float and math.isfinite(value) and 0 <= value <= top, (text, metric)
            assert kind is float or value.is_integer()
        mirrored = mirror_into(Status(), progress=values, now=datetime(2026, 1, 2, tzinfo=UTC))
        json.dumps(mirrored.to_dict(), allow_nan=False)
    assert outcomes["ok"] > 100 and outcomes["error"] > 100, outcomes  # both paths were exercised


@pytest.mark.parametrize("exc, unreachable", [
    (TimeoutError(), True),
    (ConnectionRefusedError(111, "Connection refused"), True),
    (aiohttp.ServerDisconnectedError(), True),
    (Refused("redirect refused"), False),
    (Refused("compressed response refused"), False),
    (Refused(OVER_CAP), False),
    (ProgressError("value out of range: imagesPerSecond"), False),
    (aiohttp.ClientPayloadError("x"), False),
])
def test_status_tells_an_unreachable_rank_0_from_a_refused_answer(exc: BaseException,
                                                                  unreachable: bool) -> None:
    """EndpointUnreachable (with the NetworkPolicy hint) only when rank 0 could not be reached; a refused
    answer is ProgressRefused: a NetworkPolicy is not what to look at then."""
    words, said_unreachable = _describe(exc)
    assert said_unreachable is unreachable
    planned = _plan(None, f"http://10.0.0.5:9090/metrics: {words}", unreachable=said_unreachable)
    reported = next(c for c in planned.status.conditions if c["type"] == "ProgressReported")
    assert reported["reason"] == ("EndpointUnreachable" if unreachable else "ProgressRefused")
    assert ("networkPolicy" in reported["message"]) is unreachable
