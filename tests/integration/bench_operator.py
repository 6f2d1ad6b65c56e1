"""Benchmark the operator against a real API server: memory at rest and with N PetsTrainings, and the
time from creating a PetsTraining to its Job existing, for N created at once.

    KCM_CONTROLLERS='*,-job' tests/cluster/run-with-control-plane.sh \
        .venv/bin/python tests/integration/bench_operator.py [--count 100]

The operator runs as its own process (`pets-operator run --standalone`), so its resident memory
(VmRSS from /proc) is the operator's alone. Latency is measured on this side: from the moment the
create call for a PetsTraining returns to the moment the watch on Jobs delivers its Job's ADDED
event. Results go to stdout and to bench-output/operator.json.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from pets_operator import api, crd

REPO = Path(__file__).resolve().parents[2]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))  # nearest rank
    return ordered[k]


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def wait(what: str, probe: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return
        time.sleep(0.2)
    raise SystemExit(f"bench: timed out after {timeout:.0f} s waiting for {what}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=100, help="PetsTrainings created at once (default 100)")
    parser.add_argument("--settle", type=float, default=10.0,
                        help="seconds to let memory settle (default 10)")
    parser.add_argument("--out", type=Path, default=REPO / "bench-output" / "operator.json")
    args = parser.parse_args()
    if not os.environ.get("KUBECONFIG"):
        raise SystemExit("bench: KUBECONFIG is not set: run under tests/cluster/run-with-control-plane.sh")

    cfg = client.Configuration()
    config.load_kube_config(client_configuration=cfg)
    admin = client.ApiClient(cfg)
    subprocess.run(["kubectl", "apply", "--server-side", "--force-conflicts", "-f",
                    str(REPO / "charts" / "pets-training" / "crds" / f"{api.CRD_NAME}.yaml")], check=True)
    # The chart's admission policy too, as a cluster with the chart has it (it checks spec edits only).
    subprocess.run(["kubectl", "apply", "--server-side", "-f", "-"], input=crd.policy_yaml(), text=True,
                   check=True)
    # Polled, not `kubectl wait`: that fails at once on a CRD too new to have status.conditions.
    crds = client.ApiextensionsV1Api(admin)
    deadline = time.monotonic() + 60
    while not any(c.type == "Established" and c.status == "True"
                  for c in crds.read_custom_resource_definition(api.CRD_NAME).status.conditions or []):
        if time.monotonic() > deadline:
            raise SystemExit(f"CRD {api.CRD_NAME} not Established within 60 s")
        time.sleep(0.2)
    ns = f"bench-{secrets.token_hex(3)}"
    client.CoreV1Api(admin).create_namespace({"metadata": {"name": ns}})

    metrics_port = free_port()
    exe = Path(sys.executable).with_name("pets-operator")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log = open(args.out.parent / "operator.log", "w")  # noqa: SIM115 - lives as long as the operator
    proc = subprocess.Popen([str(exe), "run", "--standalone", "--namespace", ns, "--liveness-port", "0",
                             "--metrics-port", str(metrics_port), "--log-format", "json"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        wait("the operator's metrics endpoint", lambda: _up(metrics_port), 60)
        time.sleep(args.settle)  # let kopf finish its start-up (watch streams, discovery)
        at_rest = rss_mib(proc.pid)
        print(f"operator RSS at rest: {at_rest:.1f} MiB", flush=True)

        created: dict[str, float] = {}
        seen: dict[str, float] = {}
        stop = threading.Event()
        watcher = watch.Watch()

        def watch_jobs() -> None:
            jobs = client.BatchV1Api(admin).list_namespaced_job
            for event in watcher.stream(jobs, ns, timeout_seconds=600):
                if event["type"] == "ADDED":
                    seen.setdefault(event["object"].metadata.name, time.monotonic())
                if stop.is_set() or len(seen) >= args.count:
                    watcher.stop()
                    return

        t = threading.Thread(target=watch_jobs, daemon=True)
        t.start()
        time.sleep(1.0)  # the watch is established before the first create
        custom = client.CustomObjectsApi(admin)

        def create(i: int) -> None:
            name = f"bench-{i:03d}"
            body = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name},
                    "spec": {"backend": "job", "replicas": 2, "epochs": 1}}
            custom.create_namespaced_custom_object(api.GROUP, api.VERSION, ns, api.PLURAL, body)
            created[name] = time.monotonic()

        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=32) as pool:
            list(pool.map(create, range(args.count)))
        print(f"created {args.count} PetsTrainings in {time.monotonic() - t0:.2f} s", flush=True)
        t.join(300)
        stop.set()
        if len(seen) < args.count:
            raise SystemExit(f"bench: only {len(seen)}/{args.count} Jobs appeared")
        latencies = [seen[n] - created[n] for n in created]
        all_done = max(seen.values()) - t0
        time.sleep(args.settle)
        with_n = rss_mib(proc.pid)
        reconciles = metric(metrics_port, "pets_operator_reconciles_total")
        result = {
            "count": args.count,
            "rss_at_rest_mib": round(at_rest, 1),
            f"rss_with_{args.count}_mib": round(with_n, 1),
            "create_to_job_p50_s": round(statistics.median(latencies), 3),
            "create_to_job_p99_s": round(percentile(latencies, 99), 3),
            "create_to_job_max_s": round(max(latencies), 3),
            "all_jobs_created_after_s": round(all_done, 3),
            "reconciles": reconciles,
            "cpu_cores": os.cpu_count(),
        }
        print(json.dumps(result, indent=2))
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        return 0
    finally:
        # Delete while the operator still runs: it removes its finalizers, then the namespace can go.
        client.CoreV1Api(admin).delete_namespace(ns)
        wait("the benchmark's PetsTrainings to be deleted", lambda: not client.CustomObjectsApi(
            admin).list_namespaced_custom_object(api.GROUP, api.VERSION, ns, api.PLURAL)["items"], 120)
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _up(port: int) -> bool:
    try:
        metric(port, "pets_operator_reconciles_total")
        return True
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
