"""make bench-e2e: time from `kubectl apply` of a PetsTraining to all its pods Running and to the
first training step of rank 0, over several runs, median reported.

Needs the cluster up, the images loaded and the chart installed (tests/e2e/bench.sh does that).
Times are wall-clock on this host; the first-step time comes from the container log's own
timestamp (kubectl logs --timestamps), which is the node's clock: the same clock on a local
or kind cluster. docs/trainer.md ("Start-up: where the time goes") breaks the time down.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GROUP, VERSION, PLURAL = "training.pets.dev", "v1alpha1", "petstrainings"
FIRST_STEP_MARKER = "first training step done"

SPEC: dict[str, Any] = {
    "replicas": 2,
    "epochs": 1,
    "batchSize": 16,
    "imageSize": 64,
    "model": "resnet18",
    "pretrained": False,  # no internet here: random init (the default, pretrained, needs the hub or a cache)
    "dataset": {"synthetic": {"numClasses": 4, "imagesPerClass": 16}},
    "resources": {"cpu": "800m", "memory": "2Gi"},
}


def first_step_time(namespace: str, pod: str, deadline: float) -> dt.datetime:
    while time.monotonic() < deadline:
        logs = subprocess.run(["kubectl", "-n", namespace, "logs", "--timestamps", pod],
                              text=True, capture_output=True).stdout
        for line in logs.splitlines():
            if FIRST_STEP_MARKER in line:
                stamp = line.split(" ", 1)[0]
                return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        time.sleep(0.5)
    raise SystemExit(f"{namespace}/{pod}: no '{FIRST_STEP_MARKER}' line in its log in time")


def one_run(api: Any, namespace: str, name: str, timeout_s: float) -> tuple[float, float]:
    from kubernetes import client, watch

    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PetsTraining",
            "metadata": {"name": name}, "spec": SPEC}
    applied = dt.datetime.now(dt.UTC)
    start = time.monotonic()
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    running: set[str] = set()
    rank0 = ""
    stream = watch.Watch()
    for event in stream.stream(core.list_namespaced_pod, namespace,
                               label_selector=f"{GROUP}/training={name}", timeout_seconds=int(timeout_s)):
        pod = event["object"]
        if pod.metadata.annotations.get("batch.kubernetes.io/job-completion-index") == "0":
            rank0 = pod.metadata.name
        if pod.status.phase == "Running":
            running.add(pod.metadata.name)
        if len(running) >= SPEC["replicas"]:
            stream.stop()
    if len(running) < SPEC["replicas"]:
        raise SystemExit(f"pods of {name} not all Running after {timeout_s:.0f} s: {sorted(running)}")
    to_running = time.monotonic() - start
    first = first_step_time(namespace, rank0, start + timeout_s)
    to_first_step = (first - applied).total_seconds()

    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                           propagation_policy="Foreground")
    while core.list_namespaced_pod(namespace, label_selector=f"{GROUP}/training={name}").items:
        time.sleep(0.5)
    return to_running, to_first_step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--namespace", default="pets-bench")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--out", type=Path, default=Path("bench-output/e2e.json"))
    args = parser.parse_args(argv)

    from kubernetes import client, config

    api = config.new_client_from_config()
    core = client.CoreV1Api(api)
    if not core.list_namespace(field_selector=f"metadata.name={args.namespace}").items:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=args.namespace)))

    results = []
    for run in range(1, args.runs + 1):
        to_running, to_first = one_run(api, args.namespace, f"bench-{run}", args.timeout)
        results.append({"run": run, "apply_to_running_s": round(to_running, 2),
                        "apply_to_first_step_s": round(to_first, 2)})
        print(f"run {run}/{args.runs}: all pods Running after {to_running:.1f} s, "
              f"first training step after {to_first:.1f} s", flush=True)

    summary = {
        "runs": results,
        "median_apply_to_running_s": statistics.median(r["apply_to_running_s"] for r in results),
        "median_apply_to_first_step_s": statistics.median(r["apply_to_first_step_s"] for r in results),
        "spec": SPEC,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"median apply -> all pods Running: {summary['median_apply_to_running_s']:.1f} s")
    print(f"median apply -> first training step: {summary['median_apply_to_first_step_s']:.1f} s")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
