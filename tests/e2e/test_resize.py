"""Resizing a running training on a real cluster (docs/operator.md, "Resizing a training"): 2 -> 1 -> 2,
each in the middle of an epoch, with no suspend; every sample of each epoch trained once (the trainer's
per-epoch counts), nothing done again, and the training Succeeds. And the real Kueue, with quota for one
pod, admits a 2-replica training with minReplicas 1 at one pod. Needs two worker nodes
(`make cluster-up NODES=3`), as its two pods take a node's CPU each."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from polling import wait_for
from trainings import LONGER_SPEC, POLL_S, SMALL_SPEC, Trainings, addon, kubectl

from pets_contract import gauges, names, samples

pytestmark = pytest.mark.e2e


STEP, STEPS_TOTAL = gauges.BY_KEY["step"], gauges.BY_KEY["steps_total"]
# Rank 0's own step, read inside its pod: the status mirrors it only every 10 s (the operator's progress
# poll and status writes), long enough for half an epoch to pass unseen on an idle machine.
READ_STEPS = ("import urllib.request as u; g = dict(line.split()[:2] for line in u.urlopen("
              f"'http://localhost:{names.METRICS_PORT}/metrics', timeout=5).read().decode().splitlines() "
              f"if line.startswith('pets_')); print(g['{STEP.name}'], g['{STEPS_TOTAL.name}'])")


def trainer_steps(trainings: Trainings, name: str) -> tuple[int, int] | None:
    """Rank 0's (step, steps of the whole run) as the trainer has them now; None while no rank 0 serves
    them."""
    rank0 = [p.metadata.name for p in trainings.pods(name)
             if p.status.phase == "Running" and not p.metadata.deletion_timestamp
             and p.metadata.annotations.get("batch.kubernetes.io/job-completion-index") == "0"]
    if len(rank0) != 1:
        return None
    out = kubectl("-n", trainings.namespace, "exec", rank0[0], "-c", names.TRAINER_CONTAINERS[0],
                  "--", "python", "-c", READ_STEPS, check=False)
    step, steps = (int(float(v)) for v in out.stdout.split()) if out.returncode == 0 else (0, 0)
    return (step, steps) if steps else None


def early_in_an_epoch(trainings: Trainings, name: str, epochs: int, after_step: int) -> int:
    """Rank 0's step once it trains in the first half of an epoch (an eighth to a half of its steps, so
    that a resize asked for now lands before the epoch ends), past `after_step`."""
    def probe() -> int | None:
        if (seen := trainer_steps(trainings, name)) is None:
            assert trainings.status(name).get("phase") not in ("Succeeded", "Failed"), f"{name} ended early"
            return None
        step, per_epoch = seen[0], seen[1] // epochs
        return step if step > after_step and per_epoch // 8 <= step % per_epoch <= per_epoch // 2 else None
    return wait_for(f"{name} early in an epoch, past step {after_step}", probe, 900, 0.5)


@pytest.mark.cluster_wide  # its two pods take a worker's CPU each
def test_a_training_resized_2_1_2_mid_epoch_trains_every_sample_once(trainings: Trainings) -> None:
    name = "resized"
    # Two epochs of 120 steps (1,200 images a class): 15-30 s each at 2 pods and twice that at one, so
    # that each resize, asked for early in an epoch, lands in its middle.
    data = {"synthetic": {"numClasses": 4, "imagesPerClass": 1200}}
    spec = {**LONGER_SPEC, "dataset": data, "epochs": 2, "maxRestarts": 0,
            "elastic": {"minReplicas": 1, "maxReplicas": 2}, "checkpoint": {"intervalSeconds": 30}}
    trainings.create(name, spec)

    before = early_in_an_epoch(trainings, name, spec["epochs"], 0)
    kubectl("-n", trainings.namespace, "scale", "pt", name, "--replicas", "1")
    # Running at one pod, and read once by the operator (its resume step): a run that ends between two
    # progress reads is booked only when it ends on its own (by its summary).
    wait_for(f"{name} running at 1", lambda: (s := trainings.status(name)).get("replicas") == 1
             and s.get("phase") == "Running" and "resize" not in s and int(s.get("resumeStep") or 0) >= before
             and s, 600, POLL_S)

    again = early_in_an_epoch(trainings, name, spec["epochs"], before + 1)
    kubectl("-n", trainings.namespace, "scale", "pt", name, "--replicas", "2")
    status = trainings.wait_phase(name, "Succeeded")

    print(f"resized after steps {before} and {again}; goodput {status['goodput']}")
    assert status["restarts"] == 0 and status["attempt"] == 2 and status["replicas"] == 2, status
    summary = status["summary"]
    assert summary[samples.INEXACT_EPOCHS] == [], summary  # each epoch: every sample once
    runs = status["goodput"]["attempts"]
    assert [r.get("worldSize") for r in runs] == [2, 1, 2], runs
    # The SIGTERM save: each run resumed where the one before stopped, nothing done again, and both
    # resizes stopped a run in the middle of an epoch.
    assert all(not r.get("lostSteps") for r in runs), runs
    per_epoch = int(status["stepsTotal"]) // spec["epochs"]
    assert all(r["firstStep"] % per_epoch for r in runs[1:]), (per_epoch, runs)
    assert status["goodput"]["resizingSeconds"] > 0, status["goodput"]
    events = [str(e.message) for e in trainings.core.list_namespaced_event(trainings.namespace).items
              if e.reason == "Resized" and e.involved_object.name == name]
    assert sorted(m.split(":")[0] for m in events) == ["1 -> 2 (Scaled)", "2 -> 1 (Scaled)"], events


KUEUE_API = ("kueue.x-k8s.io", "v1beta2")


@pytest.fixture
def one_pod_queue(trainings: Trainings) -> Iterator[str]:
    """A ClusterQueue with CPU for one trainer pod (SMALL_SPEC's 800m) and its LocalQueue."""
    addon("kueue")
    group, version = KUEUE_API
    custom, ns = trainings.custom, trainings.namespace
    flavor, cq = f"{ns}-flavor", f"{ns}-cq"
    objects = [
        ("resourceflavors", "ResourceFlavor", None, {"name": flavor}, {}),
        ("clusterqueues", "ClusterQueue", None, {"name": cq}, {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{
                "name": flavor, "resources": [{"name": "cpu", "nominalQuota": "1"},
                                              {"name": "memory", "nominalQuota": "8Gi"}]}]}]}),
        ("localqueues", "LocalQueue", ns, {"name": "one-pod", "namespace": ns}, {"clusterQueue": cq}),
    ]
    for plural, kind, namespace, meta, spec in objects:
        body = {"apiVersion": f"{group}/{version}", "kind": kind, "metadata": meta, "spec": spec}
        if namespace:
            custom.create_namespaced_custom_object(group, version, namespace, plural, body)
        else:
            custom.create_cluster_custom_object(group, version, plural, body)
    try:
        yield "one-pod"
    finally:
        for plural, _, namespace, meta, _ in reversed(objects):
            if namespace is None:
                custom.delete_cluster_custom_object(group, version, plural, meta["name"])


def test_kueue_with_room_for_one_pod_admits_a_two_replica_training_at_one(trainings: Trainings,
                                                                           one_pod_queue: str) -> None:
    name = "partial"
    trainings.create(name, {**SMALL_SPEC, "epochs": 1, "elastic": {"minReplicas": 1}},
                     {"kueue.x-k8s.io/queue-name": one_pod_queue})
    status = trainings.wait_phase(name, "Succeeded")
    assert (status["replicas"], trainings.get(name)["spec"]["replicas"]) == (1, 2), status
    assert status["summary"]["world_size"] == 1 and status["restarts"] == 0, status
    events = [str(e.message) for e in trainings.core.list_namespaced_event(trainings.namespace).items
              if e.reason == "Resized" and e.involved_object.name == name]
    assert [m.split(":")[0] for m in events] == ["2 -> 1 (PartialAdmission)"], events
