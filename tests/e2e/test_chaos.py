"""make chaos: a batch of trainings runs while the cluster fails around it, on a seeded schedule
(tests/e2e/chaos.py): the acting operator's pod deleted with no grace (SIGKILL) every 20-40 s (two
replicas), kube-apiserver and etcd each SIGKILLed and restarted once, a trainer pod deleted, a worker
node lost and restored, and spec.maxRestarts of two running trainings edited.

At the end every training Succeeded; each attempt had exactly one Job; restarts and disruptions are
exactly what the faults that hit each training owe it; no edit was lost; status.step never went back but
across a resume. The figures (faults by kind, trainings ok, extra attempts, work lost) are printed and
written to output/chaos.json.

    PETS_CHAOS_MODE=short|full (make chaos: full; short: 3 trainings)   PETS_CHAOS_SEED=<int> (default 1)
"""

from __future__ import annotations

import heapq
import json
import os
import random
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any, TypeVar

import chaos
import faults
import pytest
from polling import wait_for
from trainings import (
    GROUP,
    LONGER_SPEC,
    OPERATOR_NAMESPACE,
    PLURAL,
    REPO,
    TRAIN_TIMEOUT_S,
    VERSION,
    Trainings,
    addon,
    cluster_kubeconfig,
    dedicated_control_plane,
)

pytestmark = [pytest.mark.chaos]

MODE_NAME = os.environ.get("PETS_CHAOS_MODE", "short")
SEED = int(os.environ.get("PETS_CHAOS_SEED", "1"))
REPORT = REPO / "output" / "chaos.json"
LOGS = REPO / "output" / "chaos-logs"  # each operator pod's log, followed while the run lasts
KUEUE_API = ("kueue.x-k8s.io", "v1beta2")
LABEL_ATTEMPT = f"{GROUP}/attempt"
# Small pods, so most of the batch runs at once on the two workers; step checkpoints every 10 s bound the
# work a lost node costs; a lost node becomes a gang restart 10 s after the node controller says so.
SPEC: dict[str, Any] = {
    **LONGER_SPEC, "maxRestarts": 1, "resources": {"cpu": "300m", "memory": "1536Mi"},
    "dataset": {"synthetic": {"numClasses": 4, "imagesPerClass": 100}},
    "checkpoint": {"intervalSeconds": 10}, "placement": {"nodeLostSeconds": 10},
}
# A pod is deleted only while its training is short of this share of its steps: its SIGTERM save and
# restart must happen, not race the training's own end.
POD_FAULT_BEFORE = 0.7

T = TypeVar("T")


def patient(call: Callable[[], T], what: str, timeout_s: float = 120.0) -> T:
    """`call`, retried while the API server is away (restarting, or etcd is): the harness must outlive the
    faults it injects."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except Exception as error:  # the client's errors while the server restarts are of many kinds
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: no answer from the API for {timeout_s:.0f} s") from error
            time.sleep(1.0)


class Watcher(threading.Thread):
    """Reads every training's (attempt, step) and every Job of the namespace once a second, for the whole
    run: the sightings the verdict is made from. It also follows the log of every operator pod there is
    (a deleted pod's log goes with it) into output/chaos-logs/, to read after a broken promise."""

    def __init__(self, trainings: Trainings, started: float) -> None:
        super().__init__(daemon=True)
        self.trainings, self.started = trainings, started
        self.samples: dict[str, list[chaos.Sample]] = {}
        self.jobs: set[tuple[str, str, str]] = set()
        self.halt = threading.Event()
        self.followed: dict[str, subprocess.Popen[bytes]] = {}
        LOGS.mkdir(parents=True, exist_ok=True)

    def follow_operator_logs(self) -> None:
        pods = self.trainings.core.list_namespaced_pod(OPERATOR_NAMESPACE).items
        env = {**os.environ, "KUBECONFIG": str(cluster_kubeconfig())}
        for pod in pods:
            name = pod.metadata.name
            if name not in self.followed and pod.status.phase == "Running":
                with open(LOGS / f"{name}.log", "ab") as out:
                    self.followed[name] = subprocess.Popen(
                        ["kubectl", "logs", "-f", "--all-containers", "-n", OPERATOR_NAMESPACE, name],
                        stdout=out, stderr=subprocess.STDOUT, env=env)

    def stop(self) -> None:
        self.halt.set()
        self.join()
        for follower in self.followed.values():
            follower.terminate()

    def run(self) -> None:
        t = self.trainings
        while not self.halt.wait(1.0):
            try:
                items = t.custom.list_namespaced_custom_object(GROUP, VERSION, t.namespace, PLURAL)["items"]
                jobs = t.batch.list_namespaced_job(t.namespace, label_selector=f"{GROUP}/training").items
                self.follow_operator_logs()
            except Exception:  # the API server is away: nothing to see this second
                continue
            now = time.monotonic() - self.started
            for item in items:
                status = item.get("status") or {}
                if isinstance(status.get("step"), int):
                    seen = self.samples.setdefault(item["metadata"]["name"], [])
                    seen.append(chaos.Sample(now, int(status.get("attempt") or 0), status["step"]))
            for job in jobs:
                labels = job.spec.template.metadata.labels or {}
                self.jobs.add((job.metadata.labels[f"{GROUP}/training"], labels.get(LABEL_ATTEMPT, "?"),
                               job.metadata.uid))


@pytest.fixture
def chaos_queue(trainings: Trainings) -> Iterator[str]:
    """Kueue, with a ClusterQueue roomy enough for the whole batch and its LocalQueue in the namespace."""
    addon("kueue")
    group, version = KUEUE_API
    custom, ns = trainings.custom, trainings.namespace
    flavor, cq = f"{ns}-flavor", f"{ns}-cq"
    cluster_objects = [
        ("resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": flavor}, "spec": {}}),
        ("clusterqueues", {"kind": "ClusterQueue", "metadata": {"name": cq}, "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{
                "name": flavor, "resources": [{"name": "cpu", "nominalQuota": "16"},
                                              {"name": "memory", "nominalQuota": "64Gi"}]}]}]}}),
    ]
    for plural, body in cluster_objects:
        body = {"apiVersion": f"{group}/{version}", **body}
        custom.create_cluster_custom_object(group, version, plural, body)
    custom.create_namespaced_custom_object(group, version, ns, "localqueues", {
        "apiVersion": f"{group}/{version}", "kind": "LocalQueue", "metadata": {"name": "chaos"},
        "spec": {"clusterQueue": cq}})
    try:
        yield "chaos"
    finally:
        for plural, body in reversed(cluster_objects):
            custom.delete_cluster_custom_object(group, version, plural, body["metadata"]["name"])


class Injector:
    """Carries out the schedule's faults against the cluster and logs what each one hit."""

    def __init__(self, trainings: Trainings, kube_api: Any, started: float, rng: random.Random) -> None:
        from kubernetes import client

        self.t, self.started, self.rng = trainings, started, rng
        self.custom = client.CustomObjectsApi(kube_api)
        self.log: list[chaos.Injected] = []
        self.skipped: list[str] = []
        self.edits: dict[str, int] = {}
        workers = [n for n in patient(lambda: client.CoreV1Api(kube_api).list_node().items, "nodes")
                   if not dedicated_control_plane(n)]
        self.workers = sorted(str(n.metadata.name) for n in workers)

    def now(self) -> float:
        return time.monotonic() - self.started

    def statuses(self) -> dict[str, dict[str, Any]]:
        t = self.t
        items = patient(lambda: t.custom.list_namespaced_custom_object(GROUP, VERSION, t.namespace, PLURAL),
                        "the trainings")["items"]
        return {item["metadata"]["name"]: item.get("status") or {} for item in items}

    def current_pods(self, name: str, status: dict[str, Any]) -> list[Any]:
        attempt = str(status.get("attempt", 0))
        return [p for p in patient(lambda: self.t.pods(name), "pods")
                if (p.metadata.labels or {}).get(LABEL_ATTEMPT) == attempt and p.status.phase in
                ("Pending", "Running") and p.metadata.deletion_timestamp is None]

    def record(self, kind: str, target: str, hits: tuple[str, ...] = (), detail: str = "") -> None:
        fault = chaos.Injected(round(self.now(), 1), kind, target, hits, detail)
        self.log.append(fault)
        hit = f"  hits {', '.join(hits)}" if hits else ""
        print(f"[chaos] {fault.at:6.1f} s  {kind:<15} {target}{hit}" + (f"  ({detail})" if detail else ""),
              flush=True)

    def operator(self) -> None:
        def acting() -> str | None:
            pod, _ = patient(lambda: faults.active_peer(self.custom), "the peering object")
            return pod if pod and faults.operator_pid(pod) is not None else None
        deadline = time.monotonic() + 90
        while (pod := acting()) is None and time.monotonic() < deadline:
            time.sleep(1.0)  # both replicas restarting (the kubelet's back-off grows with each kill)
        if pod is None:
            self.skipped.append(f"{self.now():.0f} s operator: no acting replica for 90 s")
            return
        faults.delete_operator_pod(self.t.core, pod)
        self.record(chaos.OPERATOR, pod)

    def control_plane(self, component: str) -> None:
        started = time.monotonic()
        faults.crash_control_plane(component)
        self.record(component, component, detail=f"serving again after {time.monotonic() - started:.0f} s")

    def pod(self) -> None:
        def candidates() -> list[tuple[str, str]]:
            found: list[tuple[str, str]] = []
            for name, status in sorted(self.statuses().items()):
                total, step = status.get("stepsTotal") or 0, status.get("step") or 0
                if status.get("phase") != "Running" or (total and step >= POD_FAULT_BEFORE * total):
                    continue
                current = self.current_pods(name, status)
                if current and all(p.status.phase == "Running" for p in current):
                    found.extend((name, p.metadata.name) for p in current)
            return found
        chosen = self.soon(candidates)
        if not chosen:
            self.skipped.append(f"{self.now():.0f} s pod: no training running far from its end for 60 s")
            return
        name, pod = self.rng.choice(chosen)
        patient(lambda: self.t.core.delete_namespaced_pod(pod, self.t.namespace), "delete the pod")
        self.record(chaos.POD, pod, (name,))

    def soon(self, find: Callable[[], list[T]], within_s: float = 60.0) -> list[T]:
        """What `find` finds now, or within `within_s` (a batch under load starts slowly)."""
        deadline = time.monotonic() + within_s
        while not (found := find()) and time.monotonic() < deadline:
            time.sleep(2.0)
        return found

    def lose_node(self) -> str:
        node = self.rng.choice(self.workers)
        hits = tuple(name for name, status in sorted(self.statuses().items())
                     if status.get("phase") not in ("Succeeded", "Failed")
                     and any(p.spec.node_name == node for p in self.current_pods(name, status)))
        faults.lose_node(node)
        self.record(chaos.NODE, node, hits)
        return node

    def edit(self) -> None:
        def running() -> list[str]:
            return [name for name, status in sorted(self.statuses().items())
                    if status.get("phase") == "Running" and name not in self.edits]
        chosen = self.soon(running)
        if not chosen:
            self.skipped.append(f"{self.now():.0f} s edit: no running training left to edit for 60 s")
            return
        name = self.rng.choice(chosen)
        value = SPEC["maxRestarts"] + 1 + len(self.edits)
        patient(lambda: self.t.patch_spec(name, {"maxRestarts": value}), "the edit")
        self.edits[name] = value
        self.record(chaos.EDIT, name, detail=f"spec.maxRestarts={value}")


def told(trainings: Trainings, statuses: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What each training says of its attempts: the counts, its last failure, and its Events' words (a
    restart's event says whether it counted), for the report."""
    events = trainings.core.list_namespaced_event(trainings.namespace,
                                                  field_selector="involvedObject.kind=PetsTraining").items
    return {name: {"restarts": status.get("restarts"), "disruptions": status.get("disruptions"),
                   "attempt": status.get("attempt"), "lastFailure": status.get("lastFailure"),
                   "events": [f"{e.reason}: {e.message}" for e in sorted(
                       events, key=lambda e: str(e.first_timestamp or e.event_time or ""))
                       if e.involved_object.name == name and e.type == "Warning"]}
            for name, status in sorted(statuses.items())}


def batch(mode: chaos.Mode, queue: str) -> dict[str, tuple[dict[str, Any], dict[str, str]]]:
    """The trainings: one or two replicas in turn, the first `queued` through Kueue."""
    out = {}
    for i in range(mode.trainings):
        spec = {**SPEC, "epochs": mode.epochs, "replicas": 2 if i % 2 == 0 else 1}
        labels = {"kueue.x-k8s.io/queue-name": queue} if i < mode.queued else {}
        out[f"chaos-{i}"] = (spec, labels)
    return out


@pytest.mark.cluster_wide
def test_every_training_survives_the_chaos(trainings: Trainings, kube_api: Any, chaos_queue: str) -> None:
    mode = chaos.MODES[MODE_NAME]
    plan = chaos.schedule(SEED, mode)
    print(f"[chaos] mode {MODE_NAME}, seed {SEED}: {len(plan)} faults over {mode.duration_s:.0f} s on "
          f"{mode.trainings} trainings", flush=True)
    with faults.operator_replicas(2):
        started = time.monotonic()
        for name, (spec, labels) in batch(mode, chaos_queue).items():
            trainings.create(name, spec, labels)
        watcher = Watcher(trainings, started)
        watcher.start()
        injector = Injector(trainings, kube_api, started, random.Random(SEED))
        queue: list[tuple[float, str]] = [(f.at, f.kind) for f in plan]
        heapq.heapify(queue)
        lost_node = ""
        try:
            while queue:
                at, kind = heapq.heappop(queue)
                time.sleep(max(0.0, at - injector.now()))
                if kind == "restore":
                    faults.restore_node(lost_node)
                    print(f"[chaos] {injector.now():6.1f} s  node {lost_node} restored", flush=True)
                    lost_node = ""
                    continue
                if all(s.get("phase") in ("Succeeded", "Failed") for s in injector.statuses().values()):
                    injector.skipped.append(f"{at:.0f} s {kind}: every training had ended")
                    continue
                if kind == chaos.OPERATOR:
                    injector.operator()
                elif kind in (chaos.APISERVER, chaos.ETCD):
                    injector.control_plane(kind)
                elif kind == chaos.POD:
                    injector.pod()
                elif kind == chaos.NODE:
                    lost_node = injector.lose_node()
                    heapq.heappush(queue, (injector.now() + mode.node_down_s, "restore"))
                elif kind == chaos.EDIT:
                    injector.edit()
            if lost_node:
                faults.restore_node(lost_node)
                lost_node = ""

            def ended() -> bool:
                return all(s.get("phase") in ("Succeeded", "Failed") for s in injector.statuses().values())
            wait_for("every chaos training to end", ended, TRAIN_TIMEOUT_S, 5.0)
        finally:
            if lost_node:
                faults.restore_node(lost_node)
            watcher.stop()
        statuses = injector.statuses()
        specs = {name: trainings.get(name)["spec"] for name in statuses}
        jobs = chaos.jobs_per_attempt(watcher.jobs)
        outcome = chaos.judge(statuses, specs, injector.log, injector.edits, jobs, watcher.samples)
    outcome.figures.update(mode=MODE_NAME, seed=SEED, seconds=round(time.monotonic() - started),
                           skipped=injector.skipped)
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    report = {"figures": outcome.figures, "faults": [asdict(f) for f in injector.log],
              "broken": outcome.broken, "trainings": told(trainings, statuses)}
    REPORT.write_text(json.dumps(report, indent=2))
    print("[chaos] figures: " + json.dumps(outcome.figures), flush=True)
    print(f"[chaos] report: {REPORT}", flush=True)
    assert not outcome.broken, "\n".join(outcome.broken)
    injected = outcome.figures["faults"]
    assert (injected[chaos.NODE], injected[chaos.POD], injected[chaos.EDIT]) == (1, 1, 2), \
        f"a fault was not injected (nothing to hit): {injector.skipped}"
