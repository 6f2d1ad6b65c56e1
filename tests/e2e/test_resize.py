"""Resizing a running training on a real cluster (docs/operator.md, "Resizing a training"): 2 -> 1 -> 2,
each in the middle of an epoch, with no suspend; every sample of each epoch trained once (the trainer's
per-epoch counts), nothing done again, and the training Succeeds. And the real Kueue, with quota for one
pod, admits a 2-replica training with minReplicas 1 at one pod. Needs two worker nodes
(`make cluster-up NODES=3`), as its two pods take a node's CPU each."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from polling import wait_for
from trainings import LONGER_SPEC, POLL_S, SMALL_SPEC, Trainings, addon, kubectl

from pets_contract import samples

pytestmark = pytest.mark.e2e


def mid_epoch(trainings: Trainings, name: str, after_step: int) -> dict[str, Any]:
    """The status once the training runs in the middle of an epoch (a quarter to three quarters of its
    steps), past `after_step`."""
    def probe() -> dict[str, Any] | None:
        st = trainings.status(name)
        steps, epochs = int(st.get("stepsTotal") or 0), int(st.get("totalEpochs") or 0)
        step = int(st.get("step") or 0)
        assert st.get("phase") not in ("Succeeded", "Failed"), f"{name} ended before a mid-epoch read: {st}"
        if st.get("phase") != "Running" or not steps or not epochs or step <= after_step:
            return None
        per_epoch = steps // epochs
        return st if per_epoch // 4 <= step % per_epoch <= 3 * per_epoch // 4 else None
    return wait_for(f"{name} in the middle of an epoch, past step {after_step}", probe, 900, 1)


@pytest.mark.cluster_wide  # its two pods take a worker's CPU each
def test_a_training_resized_2_1_2_mid_epoch_trains_every_sample_once(trainings: Trainings) -> None:
    name = "resized"
    # An epoch of 120 steps (1,200 images a class): 30 s at 2 pods and 60 s at one, so the operator's
    # progress read, every 10 s, sees the middle of each (LONGER_SPEC's 20-step epochs take 5 s). Two
    # epochs: the first resize in the first, the second in the second.
    data = {"synthetic": {"numClasses": 4, "imagesPerClass": 1200}}
    spec = {**LONGER_SPEC, "dataset": data, "epochs": 2, "maxRestarts": 0,
            "elastic": {"minReplicas": 1, "maxReplicas": 2}, "checkpoint": {"intervalSeconds": 30}}
    trainings.create(name, spec)

    before = mid_epoch(trainings, name, 0)
    kubectl("-n", trainings.namespace, "scale", "pt", name, "--replicas", "1")
    wait_for(f"{name} running at 1", lambda: (s := trainings.status(name)).get("replicas") == 1
             and s.get("phase") == "Running" and "resize" not in s and s, 600, POLL_S)

    again = mid_epoch(trainings, name, int(before["step"]) + 1)
    kubectl("-n", trainings.namespace, "scale", "pt", name, "--replicas", "2")
    status = trainings.wait_phase(name, "Succeeded")

    print(f"resized at steps {before['step']} and {again['step']}; goodput {status['goodput']}")
    assert status["restarts"] == 0 and status["attempt"] == 2 and status["replicas"] == 2, status
    summary = status["summary"]
    assert summary[samples.INEXACT_EPOCHS] == [], summary  # each epoch: every sample once
    runs = status["goodput"]["attempts"]
    assert [r.get("worldSize") for r in runs] == [2, 1, 2], runs
    # The SIGTERM save: each run resumed where the one before stopped, nothing done again.
    assert all(not r.get("lostSteps") for r in runs), runs
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
