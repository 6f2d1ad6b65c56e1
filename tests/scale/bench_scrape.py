"""One progress-scrape pass over 1000 pods, 50 of them slow or hostile (issue 28): does a bad pod hold a
scrape slot longer than its time budget, slow the pass, stall the event loop or grow the memory?

    .venv/bin/python tests/scale/bench_scrape.py [--count 1000] [--hostile 50] [--repeats 3]
                                                 [--out output/bench-scrape.json]
    make bench-scrape                            # the same, with BENCH_SCRAPE_ARGS

COUNT metrics endpoints listen on COUNT loopback addresses (127.1.x.y; Linux routes all of 127.0.0.0/8
to lo), all on one port, as rank 0's pods do on their pod IPs. They run in separate server processes,
so that serving costs nothing on the scraper's event loop. A normal endpoint answers the trainer's real
page (pets_training.progress.MetricsServer with every gauge set, rendered once by prometheus_client);
a hostile one is one of HOSTILE_MODES, spread evenly among the normal ones.

The scraper is the operator's own (`pets_operator.scraper.Scraper`, its `client_session`, the operator's
default concurrency and timeout), run for one `one_pass` in a fresh process per scenario:

  (a) COUNT normal endpoints
  (b) COUNT - HOSTILE normal + HOSTILE hostile

Measured per scenario: the pass's wall time; how long each target held a slot (from aiohttp's
request start, right after the slot is taken, to the scraper's `changed` callback, right after it is
given back); the scraper process's peak RSS increase over the pass (ru_maxrss); the share of normal
targets with a fresh reading; the event loop's lag (the worst delay of a 10 ms ticker during the pass).
A table goes to stdout, the JSON to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import random
import resource
import socket
import statistics
import sys
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from multiprocessing.context import SpawnProcess
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from pets_operator import api
from pets_operator.scraper import Reading, Scraper, ScrapeTarget, client_session
from prometheus_client import generate_latest

from pets_contract import gauges
from pets_training.progress import MetricsServer, epoch_record

HOSTILE_MODES = (
    "drip",  # 200, then a byte a second for ever
    "endless",  # 200, then a body that never ends, as fast as it goes
    "gzip_bomb",  # Content-Encoding: gzip, 1 MiB that inflates to 1 GiB
    "redirect",  # 302 to another pod's endpoint
    "silent",  # accepts the connection and never answers (nor reads)
    "garbage",  # random bytes instead of HTTP
    "junk_page",  # 200 and 250 KiB of random bytes: under the body cap, parsed on the loop
)
RAW_MODES = {"silent", "garbage"}  # served by asyncio sockets, not by aiohttp.web
NORMAL = "normal"
TICK = 0.01  # the loop-lag ticker's period


@dataclass(frozen=True)
class Endpoint:
    index: int
    address: str
    mode: str


def pod_uid(endpoint: Endpoint) -> str:
    return f"uid-{endpoint.index}"


def endpoint_address(index: int) -> str:
    """127.1.0.1, 127.1.0.2, ... 250 per third octet: COUNT distinct loopback addresses."""
    return f"127.1.{index // 250}.{index % 250 + 1}"


def plan_endpoints(count: int, hostile: int) -> list[Endpoint]:
    """COUNT endpoints, HOSTILE of them hostile, spread evenly, cycling through HOSTILE_MODES."""
    modes = [NORMAL] * count
    for k in range(hostile):
        modes[int((k + 0.5) * count / hostile)] = HOSTILE_MODES[k % len(HOSTILE_MODES)]
    return [Endpoint(i, endpoint_address(i), mode) for i, mode in enumerate(modes)]


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------- the pages


def trainer_page() -> bytes:
    """The page rank 0 serves mid-run: the trainer's own MetricsServer with every gauge set."""
    server = MetricsServer(0)
    try:
        server.update(epoch_record(epoch=7, total_epochs=20, train_loss=0.412345, eval_accuracy=0.875,
                                   images_per_second=512.25, elapsed_seconds=1234.5,
                                   epoch_seconds=[170.0] * 7))
        server.set("step", 7 * 115 + 42)
        server.set("steps_total", 20 * 115)
        server.set("checkpoint_epoch", 6)
        served = set(gauges.BY_KEY)
        for key in sorted(served - set(server.gauges)):  # the rest (time split, dataset, resume): a count
            server.set(key, 42.0)
        assert set(server.gauges) == served
        return bytes(generate_latest(server.registry))
    finally:
        server.close()


def gzip_bomb() -> bytes:
    """1 MiB of gzip that inflates to 1 GiB of zeros."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip framing
    zeros = b"\0" * (1 << 20)
    return b"".join([deflate.compress(zeros) for _ in range(1024)] + [deflate.flush()])


# ------------------------------------------------------------------------------------- the servers

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def write_until_hung_up(resp: web.StreamResponse, chunk: bytes, pause: float) -> None:
    try:
        while True:
            await resp.write(chunk)
            await asyncio.sleep(pause)
    except (ConnectionError, RuntimeError):
        pass  # the scraper hung up


def web_handlers(port: int) -> dict[str, Handler]:
    page = trainer_page()
    bomb = gzip_bomb()
    junk = random.Random(28).randbytes(250 * 1024)
    page_headers = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}

    async def normal(request: web.Request) -> web.StreamResponse:
        return web.Response(body=page, headers=page_headers)

    async def drip(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers=page_headers)
        await resp.prepare(request)
        await write_until_hung_up(resp, b"#", 1.0)
        return resp

    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers=page_headers)
        await resp.prepare(request)
        await write_until_hung_up(resp, b"pets_epoch 1\n" * 5000, 0.0)
        return resp

    async def bomb_handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={**page_headers, "Content-Encoding": "gzip"})
        resp.content_length = len(bomb)
        await resp.prepare(request)
        try:
            for at in range(0, len(bomb), 64 * 1024):
                await resp.write(bomb[at:at + 64 * 1024])
        except (ConnectionError, RuntimeError):
            pass
        return resp

    async def redirect(request: web.Request) -> web.StreamResponse:
        return web.Response(status=302, headers={"Location": f"http://{endpoint_address(0)}:{port}/metrics"})

    async def junk_page(request: web.Request) -> web.StreamResponse:
        return web.Response(body=junk, headers=page_headers)

    return {NORMAL: normal, "drip": drip, "endless": endless, "gzip_bomb": bomb_handler,
            "redirect": redirect, "junk_page": junk_page}


async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        await asyncio.Event().wait()  # never reads, never writes, never closes
    finally:
        writer.close()


async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(os.urandom(64 * 1024))
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


RAW_HANDLERS = {"silent": silent, "garbage": garbage}


async def serve_endpoints(endpoints: list[Endpoint], port: int, ready: Any) -> None:
    """Every endpoint on (its address, port): one aiohttp app per mode, one site per address."""
    handlers = web_handlers(port)
    by_mode: dict[str, list[str]] = {}
    for endpoint in endpoints:
        by_mode.setdefault(endpoint.mode, []).append(endpoint.address)
    for mode, addresses in by_mode.items():
        if mode in RAW_HANDLERS:
            for address in addresses:
                await asyncio.start_server(RAW_HANDLERS[mode], address, port)
            continue
        app = web.Application()
        app.router.add_route("GET", "/metrics", handlers[mode])
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        for address in addresses:
            await web.TCPSite(runner, address, port, backlog=1024).start()
    ready.set()
    await asyncio.Event().wait()  # until the benchmark terminates this process


def server_process_main(endpoints: list[Endpoint], port: int, ready: Any) -> None:
    asyncio.run(serve_endpoints(endpoints, port, ready))


def start_servers(endpoints: list[Endpoint], port: int, processes: int) -> list[SpawnProcess]:
    context = multiprocessing.get_context("spawn")
    started = []
    for share in range(processes):
        ready = context.Event()
        process = context.Process(target=server_process_main, args=(endpoints[share::processes], port, ready),
                                  daemon=True, name=f"bench-scrape-server-{share}")
        process.start()
        started.append((process, ready))
    for process, ready in started:
        if not ready.wait(120):
            raise RuntimeError(f"{process.name} did not start serving (exit code {process.exitcode})")
    return [process for process, _ready in started]


def stop_servers(processes: list[SpawnProcess]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(10)


# --------------------------------------------------------------------------------- the scraper side


@dataclass
class SlotClock:
    """When each read took its slot (aiohttp's request start, the first thing after the gate) and when
    it gave it back (the scraper's `changed` callback, the first thing after the gate on a first pass)."""
    taken: dict[str, float] = field(default_factory=dict)
    released: dict[str, float] = field(default_factory=dict)

    def trace_config(self) -> aiohttp.TraceConfig:
        async def on_request_start(_session: Any, _ctx: Any, params: aiohttp.TraceRequestStartParams) -> None:
            self.taken[str(params.url.host)] = time.monotonic()

        config = aiohttp.TraceConfig()
        config.on_request_start.append(on_request_start)
        config.freeze()
        return config

    def release(self, key: Any) -> None:
        self.released[key] = time.monotonic()

    def held(self, address: str) -> float:
        return self.released[address] - self.taken[address]


@dataclass
class LoopLag:
    """The worst delay, past its due time, of a TICK-second ticker; and the worst part of one delay that
    the loop's own thread spent on the CPU (the rest: the process waited for a core on a busy machine)."""
    worst_s: float = 0.0
    worst_busy_s: float = 0.0

    async def watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            due, cpu_before = time.monotonic() + TICK, time.thread_time()
            await asyncio.sleep(TICK)
            late = max(0.0, time.monotonic() - due)
            self.worst_s = max(self.worst_s, late)
            self.worst_busy_s = max(self.worst_busy_s, min(late, time.thread_time() - cpu_before))


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure_one_pass(endpoints: list[Endpoint], port: int, concurrency: int, timeout: float,
                           interval: float) -> dict[str, Any]:
    clock = SlotClock()
    targets = [ScrapeTarget(e.address, pod_uid(e), e.address) for e in endpoints]  # key: the address
    scraper = Scraper(port, interval, concurrency, timeout, lambda: targets, clock.release)
    async with client_session(timeout, concurrency) as session:
        session.trace_configs.append(clock.trace_config())
        warm = [t for t, e in zip(targets, endpoints, strict=True) if e.mode == NORMAL][:concurrency]
        await Scraper(port, interval, concurrency, timeout, lambda: warm, lambda _k: None).one_pass(session)
        rss_before, load = peak_rss_mib(), os.getloadavg()[0]
        lag, stop_ticker = LoopLag(), asyncio.Event()
        ticker = asyncio.create_task(lag.watch(stop_ticker))
        await asyncio.sleep(5 * TICK)  # the ticker is running
        started, cpu_before = time.monotonic(), cpu_seconds()
        await scraper.one_pass(session)
        pass_s, cpu_s = time.monotonic() - started, cpu_seconds() - cpu_before
        stop_ticker.set()
        await ticker
    return summarise(endpoints, scraper, clock, pass_s=pass_s, cpu_s=cpu_s, loop_lag_s=lag.worst_s,
                     loop_busy_s=lag.worst_busy_s, rss_increase_mib=peak_rss_mib() - rss_before,
                     rss_peak_mib=peak_rss_mib(), load_average_1m=load)


def summarise(endpoints: list[Endpoint], scraper: Scraper, clock: SlotClock,
              **measured: float) -> dict[str, Any]:
    holds = {e.address: clock.held(e.address) for e in endpoints}
    normal = [e for e in endpoints if e.mode == NORMAL]
    fresh = [e for e in normal if _outcome(scraper.reading(e.address, pod_uid(e))) == "read"]
    by_mode: dict[str, dict[str, Any]] = {}
    for mode in sorted({e.mode for e in endpoints}):
        of_mode = [e for e in endpoints if e.mode == mode]
        outcomes = Counter(_outcome(scraper.reading(e.address, pod_uid(e))) for e in of_mode)
        worst_hold = max(holds[e.address] for e in of_mode)
        by_mode[mode] = {"targets": len(of_mode), "max_slot_hold_s": round(worst_hold, 3),
                         "outcomes": dict(outcomes)}
    return {
        "targets": len(endpoints),
        "hostile": len(endpoints) - len(normal),
        "pass_s": round(measured["pass_s"], 3),
        "max_slot_hold_s": round(max(holds.values()), 3),
        "max_slot_hold_normal_s": round(max(holds[e.address] for e in normal), 3),
        "rss_increase_mib": round(measured["rss_increase_mib"], 1),
        "rss_peak_mib": round(measured["rss_peak_mib"], 1),
        "normal_fresh_percent": round(100 * len(fresh) / len(normal), 1),
        "loop_lag_max_ms": round(1000 * measured["loop_lag_s"], 1),
        "loop_busy_max_ms": round(1000 * measured["loop_busy_s"], 1),
        "scraper_cpu_s": round(measured["cpu_s"], 3),
        "load_average_1m": round(measured["load_average_1m"], 2),
        "by_mode": by_mode,
    }


def _outcome(reading: Reading | None) -> str:
    """`read` (a fresh reading with gauges), `read, no gauges`, or the kind of error."""
    if reading is None:
        return "no reading"
    if reading.error is None:
        return "read" if reading.progress else "read, no gauges"
    return reading.error.split("/metrics: ", 1)[-1]


def scraper_process_main(endpoints: list[Endpoint], port: int, settings: dict[str, float], out: Any) -> None:
    out.send(asyncio.run(measure_one_pass(endpoints, port, int(settings["concurrency"]),
                                          settings["timeout"], settings["interval"])))


def measure_in_fresh_process(endpoints: list[Endpoint], port: int,
                             settings: dict[str, float]) -> dict[str, Any]:
    """One pass in a process of its own: its peak RSS and its event loop are the scraper's alone."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=scraper_process_main, args=(endpoints, port, settings, send),
                              name="bench-scrape-scraper")
    process.start()
    try:
        if not receive.poll(600):
            raise RuntimeError("the scraper process gave no result within 600 s")
        result: dict[str, Any] = receive.recv()
        return result
    finally:
        process.join(30)


# ------------------------------------------------------------------------------------------ the run


def run_scenario(count: int, hostile: int, settings: dict[str, float],
                 server_processes: int) -> dict[str, Any]:
    endpoints = plan_endpoints(count, hostile)
    port = free_port(endpoints[0].address)
    servers = start_servers(endpoints, port, server_processes)
    try:
        return measure_in_fresh_process(endpoints, port, settings)
    finally:
        stop_servers(servers)


ROWS = [
    ("pass wall time (s)", "pass_s"),
    ("max slot hold, any target (s)", "max_slot_hold_s"),
    ("max slot hold, normal target (s)", "max_slot_hold_normal_s"),
    ("peak RSS increase (MiB)", "rss_increase_mib"),
    ("normal targets with a fresh reading (%)", "normal_fresh_percent"),
    ("event-loop lag, max (ms)", "loop_lag_max_ms"),
    ("... of which the loop was on the CPU (ms)", "loop_busy_max_ms"),
    ("scraper CPU over the pass (s)", "scraper_cpu_s"),
    ("load average (1 min) at the start", "load_average_1m"),
]


def cell(runs: list[dict[str, Any]], key: str) -> str:
    """One value, or over several runs the median and, in brackets, the worst."""
    values = sorted(run[key] for run in runs)
    if len(values) == 1:
        return str(values[0])
    worst = values[0] if key == "normal_fresh_percent" else values[-1]
    return f"{statistics.median(values):g} ({worst:g})"


def print_table(scenarios: dict[str, list[dict[str, Any]]]) -> None:
    names = list(scenarios)
    print("| | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for label, key in ROWS:
        print(f"| {label} | " + " | ".join(cell(scenarios[name], key) for name in names) + " |")
    for name, runs in scenarios.items():
        for mode in runs[0]["by_mode"]:
            if mode == NORMAL:
                continue
            seen = [run["by_mode"][mode] for run in runs]
            outcomes = sum((Counter(s["outcomes"]) for s in seen), Counter())
            print(f"  {name}: {mode:<10} x{seen[0]['targets']:<3} max hold "
                  f"{max(s['max_slot_hold_s'] for s in seen):.2f} s  {dict(outcomes)}")


def operator_defaults() -> dict[str, float]:
    return {"concurrency": api.DEFAULT_SCRAPE_CONCURRENCY, "timeout": api.DEFAULT_SCRAPE_TIMEOUT,
            "interval": api.DEFAULT_PROGRESS_INTERVAL}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000, help="endpoints in all (default 1000)")
    parser.add_argument("--hostile", type=int, default=50, help="hostile ones in scenario b (default 50)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each scenario (default 3)")
    parser.add_argument("--server-processes", type=int, default=2, help="processes serving the endpoints")
    parser.add_argument("--out", type=Path, default=Path("output/bench-scrape.json"))
    args = parser.parse_args(argv)
    settings = operator_defaults()
    started = time.monotonic()
    normal_only = f"a: {args.count} normal"
    with_hostile = f"b: {args.count - args.hostile} normal + {args.hostile} hostile"
    scenarios: dict[str, list[dict[str, Any]]] = {normal_only: [], with_hostile: []}
    for _ in range(args.repeats):  # interleaved: a busy spell of the machine hits both alike
        for name, hostile in ((normal_only, 0), (with_hostile, args.hostile)):
            scenarios[name].append(run_scenario(args.count, hostile, settings, args.server_processes))
    waves = math.ceil(args.count / settings["concurrency"])
    result = {"settings": settings, "timeout_x_waves_s": waves * settings["timeout"], "scenarios": scenarios,
              "load_average": os.getloadavg(), "bench_s": round(time.monotonic() - started, 1),
              "python": sys.version.split()[0], "aiohttp": aiohttp.__version__}
    print(f"operator defaults: concurrency {settings['concurrency']}, timeout {settings['timeout']} s "
          f"({waves} waves: timeout x waves = {waves * settings['timeout']} s)")
    print_table(scenarios)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
