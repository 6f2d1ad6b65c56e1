"""End to end: one tenant's hostile training pods cannot hurt the operator, the client or another tenant.

The hostile image (tests/e2e/hostile/) is the operator image with the trainer's entry point and a `sh` of
its own, as a tenant who controls `spec.image` could ship it. Its rank 0 serves one attack on the operator's
scraper per HOSTILE_MODE; its `sh` adds entries to the listing of the client's `fetch` pod.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from polling import wait_for
from trainings import (
    GROUP,
    LONGER_SPEC,
    OPERATOR_NAMESPACE,
    PLURAL,
    POLL_S,
    REPO,
    TRAIN_TIMEOUT_S,
    VERSION,
    Trainings,
    cluster_kubeconfig,
    kubectl,
)

from pets_contract import __version__

pytestmark = pytest.mark.e2e

HOSTILE_IMAGE = f"pets-training/hostile:{__version__}"
BASE_IMAGE = f"pets-training/operator:{__version__}"  # on every node already (tests/e2e/lib.sh load_images)

# Each mode of tests/e2e/hostile/pets-launch, and the words its training's ProgressReported=False says.
EXPECTED_FAILURE = {
    "bomb": "compressed response refused",
    "redirect": "redirect refused",
    "endless": "response over 256 KiB",
    "drip": "timed out",
    "values": "value out of range",
    "garbage": "not Prometheus text format",
}
# The operator's peak resident memory (VmHWM of its process) stays under this with all of them running:
# before the scraper was bounded, the bomb alone took it past the chart's 1Gi limit.
OPERATOR_MEMORY_BOUND = 400 << 20
PROGRESS_INTERVAL_S = 10  # the operator's default --progress-interval


@pytest.fixture(scope="session")
def hostile_image(kube_api: Any) -> Iterator[str]:
    """The hostile image, built on the operator image (which tests/e2e/run.sh built and loaded on every
    node, so a node imports only the hostile layer) and loaded into the nodes that run pods; removed from
    them afterwards (it would hold a superseded operator's layers)."""
    subprocess.run(["docker", "build", "-q", "-t", HOSTILE_IMAGE,
                    "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", str(REPO / "tests" / "e2e" / "hostile")],
                   check=True, env={**os.environ, "DOCKER_BUILDKIT": "0"})
    subprocess.run([str(REPO / "tests" / "cluster" / "load-image.sh"), HOSTILE_IMAGE], check=True)
    yield HOSTILE_IMAGE
    subprocess.run([str(REPO / "tests" / "cluster" / "load-image.sh"), "--remove", HOSTILE_IMAGE], check=True)
    subprocess.run(["docker", "image", "rm", HOSTILE_IMAGE], check=True, stdout=subprocess.DEVNULL)


def hostile_spec(image: str, mode: str, token: str = "") -> dict[str, Any]:
    return {**LONGER_SPEC, "image": image, "replicas": 1, "epochs": 1, "maxRestarts": 0,
            "resources": {"cpu": "100m", "memory": "256Mi"},
            "env": [{"name": "HOSTILE_MODE", "value": mode},
                    {"name": "HOSTILE_TOKEN", "value": token}]}


def operator_pod(core: Any) -> Any:
    pods = [p for p in core.list_namespaced_pod(OPERATOR_NAMESPACE,
                                                label_selector="app.kubernetes.io/name=pets-training").items
            if p.status.phase == "Running"]
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return pods[0]


def restarts(pod: Any) -> int:
    return sum(c.restart_count for c in pod.status.container_statuses or [])


def peak_memory_bytes(pod: Any) -> int:
    """The operator process's peak resident set (VmHWM; it is the container's PID 1)."""
    status = kubectl("-n", OPERATOR_NAMESPACE, "exec", pod.metadata.name, "--",
                     "cat", "/proc/1/status").stdout
    kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(kib) * 1024


def progress_reported_false(tenant: Trainings, name: str) -> dict[str, Any] | None:
    conditions = tenant.status(name).get("conditions") or []
    return next((c for c in conditions if c["type"] == "ProgressReported" and c["status"] == "False"), None)


def test_hostile_metrics_endpoints_cannot_hurt_the_operator_or_other_tenants(
        trainings: Trainings, other_tenant: Trainings, hostile_image: str, kube_api: Any) -> None:
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    operator = operator_pod(core)
    restarts_before = restarts(operator)
    token = f"pets-secret-{uuid.uuid4().hex}"
    for mode in EXPECTED_FAILURE:
        other_tenant.create(f"hostile-{mode}", hostile_spec(hostile_image, mode, token))
    normal = [f"normal-{i}" for i in range(3)]
    for name in normal:
        # long enough for three 10 s progress polls while Running, now that an epoch takes a few seconds
        trainings.create(name, {**LONGER_SPEC, "replicas": 1, "epochs": 8})

    # Poll the normal trainings until they end; note when each one's status.step changes while it runs.
    step_changes: dict[str, list[tuple[float, int]]] = {name: [] for name in normal}
    running = set(normal)
    deadline = time.monotonic() + TRAIN_TIMEOUT_S
    while running and time.monotonic() < deadline:
        for name in sorted(running):
            status = trainings.status(name)
            if status.get("phase") in ("Succeeded", "Failed"):
                running.discard(name)
                continue
            seen = step_changes[name]
            if status.get("phase") == "Running" and status.get("step") and (
                    not seen or seen[-1][1] != status["step"]):
                seen.append((time.monotonic(), status["step"]))
        time.sleep(POLL_S)
    for name in normal:
        status = trainings.wait_phase(name, "Succeeded", 60)
        assert status["restarts"] == 0, (name, status)
        seen = step_changes[name]
        assert len(seen) >= 3, f"{name}: status.step changed only {len(seen)} time(s) while Running: {seen}"
        gaps = [later[0] - earlier[0] for earlier, later in zip(seen, seen[1:], strict=False)]
        print(f"{name}: status.step seen changing {len(seen)} times, gaps (s): {[round(g) for g in gaps]}")
        # One progress read every 10 s: a step seen in status every interval or so, as without hostile pods.
        assert statistics.median(gaps) <= 2 * PROGRESS_INTERVAL_S + POLL_S, (name, gaps)

    for mode, words in EXPECTED_FAILURE.items():
        wait_for(f"hostile-{mode}: ProgressReported=False saying {words!r}",
                 lambda m=mode, w=words: (c := progress_reported_false(other_tenant, f"hostile-{m}"))
                 and w in c["message"] and c, 120, POLL_S)

    # The token is in the hostile trainings' spec.env (their pods serve it): what must not hold it is
    # what the operator writes, the statuses and Events, and its log.
    items = other_tenant.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
    everything = [
        json.dumps([item.get("status") for item in items]),
        kubectl("get", "events", "--all-namespaces", "-o", "json").stdout,
        kubectl("-n", OPERATOR_NAMESPACE, "logs", operator.metadata.name).stdout,
    ]
    assert not [text for text in everything if token in text], "the redirect's token reached the cluster"

    after = operator_pod(core)
    assert after.metadata.uid == operator.metadata.uid and restarts(after) == restarts_before, \
        f"the operator restarted: {after.status.container_statuses}"
    peak = peak_memory_bytes(after)
    print(f"operator peak memory (VmHWM) with 6 hostile trainings running: {peak / 2**20:.0f} MiB")
    assert peak < OPERATOR_MEMORY_BOUND, f"operator peak memory {peak / 2**20:.0f} MiB"


def tree_snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in root.rglob("*")}


# What the hostile `sh` adds to the fetch pod's listing, by the file asked for (tests/e2e/hostile/sh).
HOSTILE_LISTING = {
    "summary.json": ".ssh/authorized_keys",  # a plain name, but not one asked for
    "config.yaml": "../escaped",  # an empty file outside the destination
    "progress.jsonl": "/tmp/pets-hostile-escaped",  # an empty file at an absolute path
}


def test_fetch_refuses_a_hostile_listing_and_writes_nothing(trainings: Trainings, shared_output: str,
                                                            hostile_image: str, tmp_path: Path) -> None:
    from pets_client import FetchError, PetsTrainingClient

    name = "hostile-fetch"
    spec = hostile_spec(hostile_image, "values")
    spec["output"] = {"persistentVolumeClaim": {"claimName": shared_output}}
    trainings.create(name, spec)
    trainings.wait_phase(name, "Running")
    around = tmp_path / "around"
    dest = around / "dest"
    dest.mkdir(parents=True)
    (around / "sibling.txt").write_text("untouched\n")
    (dest / "kept.txt").write_text("untouched\n")
    before = tree_snapshot(tmp_path)
    absolute = Path("/tmp/pets-hostile-escaped")
    absolute.unlink(missing_ok=True)

    pets = PetsTrainingClient(namespace=trainings.namespace, kubeconfig=cluster_kubeconfig())
    for asked, entry in HOSTILE_LISTING.items():
        with pytest.raises(FetchError) as refused:
            pets.fetch(name, dest, files=[asked])
        assert repr(entry) in str(refused.value), (asked, str(refused.value))
        assert tree_snapshot(tmp_path) == before, asked
        assert not absolute.exists()
