"""End to end against the real controllers a platform team runs beside us: Kubeflow's training-operator
(PyTorchJob backend) and Kueue (queueing, preemption), both installed into the cluster by the harness
(`tests/cluster/cluster.sh addon-up kubeflow|kueue`), plus an eviction through the Eviction API."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from polling import wait_for
from trainings import (  # tests/e2e/trainings.py
    GROUP,
    LONGER_SPEC,
    PLURAL,
    POLL_S,
    SMALL_SPEC,
    VERSION,
    Trainings,
    addon,
    kubectl,
    pod_logs,
    pod_of_rank,
)

pytestmark = pytest.mark.e2e

KUEUE_API = ("kueue.x-k8s.io", "v1beta2")
PYTORCHJOB_API = ("kubeflow.org", "v1", "pytorchjobs")



@pytest.fixture(scope="module")
def kubeflow() -> None:
    addon("kubeflow")


@pytest.fixture(scope="module")
def kueue() -> None:
    addon("kueue")


def pytorchjobs(trainings: Trainings, name: str) -> list[dict[str, Any]]:
    group, version, plural = PYTORCHJOB_API
    return list(trainings.custom.list_namespaced_custom_object(
        group, version, trainings.namespace, plural, label_selector=f"{GROUP}/training={name}")["items"])


def rank_pod(trainings: Trainings, name: str, rank: int) -> Any:
    """Rank r's pod of a PyTorchJob: the Master is rank 0, Worker i is rank i + 1."""
    kind, index = ("master", 0) if rank == 0 else ("worker", rank - 1)
    for pod in trainings.pods(name):
        labels = pod.metadata.labels or {}
        replica = (labels.get("training.kubeflow.org/replica-type"),
                   labels.get("training.kubeflow.org/replica-index"))
        if replica == (kind, str(index)) and not pod.metadata.deletion_timestamp:
            return pod
    pytest.fail(f"no {kind} {index} pod of {name}: {[p.metadata.name for p in trainings.pods(name)]}")


def phases_seen(trainings: Trainings, name: str, until: str, seen: list[str], timeout_s: float = 900
                ) -> dict[str, Any]:
    """Wait for phase `until`, recording every phase passed on the way."""
    def probe() -> dict[str, Any] | None:
        status = trainings.status(name)
        phase = status.get("phase")
        if phase and (not seen or seen[-1] != phase):
            seen.append(phase)
        if phase == "Failed" and until != "Failed":
            pytest.fail(f"{name} Failed: {status}\n{trainings.describe(name)}")
        return status if phase == until else None
    return wait_for(f"{name} phase {until}", probe, timeout_s, 1.0)


# ----------------------------------------------------------------------------- PyTorchJob, real controller


@pytest.mark.usefixtures("kubeflow")
def test_pytorchjob_trains_under_the_real_training_operator(trainings: Trainings) -> None:
    name = "pj"
    trainings.create(name, {**LONGER_SPEC, "backend": "pytorchjob"})

    def progressed() -> dict[str, Any] | None:
        status = trainings.status(name)
        if status.get("phase") == "Failed":
            pytest.fail(f"Failed: {status}\n{trainings.describe(name)}")
        return status if status.get("phase") == "Succeeded" else None

    status = wait_for(f"{name} Succeeded", progressed, 900, 1.0)
    # Rank 0's progress was mirrored while it ran, whatever the pace of this machine (a 1 s poll can miss a
    # short Running phase): status.step comes from a scrape only (the summary carries none), and the last
    # scrape that moved it came before the completion.
    reported = next(c for c in status["conditions"] if c["type"] == "ProgressReported")
    assert (reported["status"], reported["reason"]) == ("True", "Scraped"), reported
    assert 0 < status["step"] <= status["stepsTotal"], status
    assert status["lastProgressTime"] <= status["completionTime"], status
    assert status["backend"] == "pytorchjob" and status["backendReason"] == "spec.backend is pytorchjob"
    summary = status["summary"]  # from the Master's termination message
    assert summary["status"] == "succeeded" and summary["world_size"] == 2, summary
    assert not trainings.jobs(name), "a PyTorchJob training made a Job"
    (pj,) = pytorchjobs(trainings, name)
    assert any(c["type"] == "Succeeded" and c["status"] == "True" for c in pj["status"]["conditions"]), pj
    # The controller's own rendezvous variables fed pets-launch on both ranks.
    for rank in (0, 1):
        logs = pod_logs(trainings.namespace, rank_pod(trainings, name, rank).metadata.name)
        assert f"machine {rank} of 2" in logs, logs[-3000:]
    wide = kubectl("-n", trainings.namespace, "get", "pt", name, "-o", "wide").stdout
    assert "pytorchjob" in wide, wide


@pytest.mark.usefixtures("kubeflow")
def test_pytorchjob_worker_deleted_mid_run_restarts_the_gang_and_resumes(trainings: Trainings,
                                                                         shared_output: str) -> None:
    name = "pj-resume"
    # 10 epochs: the deletion lands while it trains (as in test_training's crash, 4 could be over by then)
    spec = {**LONGER_SPEC, "backend": "pytorchjob", "epochs": 10,
            "output": {"persistentVolumeClaim": {"claimName": shared_output}}}
    trainings.create(name, spec)
    trainings.wait_epoch(name, 1)
    wait_for(f"{name} status.lastCheckpoint", lambda: trainings.status(name).get("lastCheckpoint"),
             120, POLL_S)
    worker = rank_pod(trainings, name, 1)
    trainings.core.delete_namespaced_pod(worker.metadata.name, trainings.namespace)

    status = trainings.wait_phase(name, "Succeeded")
    assert status["restarts"] == 1, status
    assert status["epoch"] == spec["epochs"] and status["children"]["pytorchJob"] == f"{name}-r1", status
    assert [p["metadata"]["name"] for p in pytorchjobs(trainings, name)] == [f"{name}-r1"]
    master = pod_logs(trainings.namespace, rank_pod(trainings, name, 0).metadata.name)
    assert "resume: continuing" in master, master[-3000:]  # after an epoch, or at the step saved on SIGTERM


@pytest.mark.usefixtures("kubeflow")
def test_pytorchjob_suspend_resume_and_delete(trainings: Trainings) -> None:
    name = "pj-suspend"
    trainings.create(name, {**LONGER_SPEC, "backend": "pytorchjob", "epochs": 3})
    trainings.wait_phase(name, "Running")
    trainings.patch_spec(name, {"suspend": True})
    trainings.wait_phase(name, "Suspended", 180)
    (pj,) = pytorchjobs(trainings, name)
    assert pj["spec"]["runPolicy"]["suspend"] is True
    wait_for("the suspended PyTorchJob's pods to go", lambda: not [
        p for p in trainings.pods(name) if p.status.phase in ("Pending", "Running")], 180, POLL_S)
    trainings.patch_spec(name, {"suspend": False})
    trainings.wait_phase(name, "Running", 300)

    trainings.custom.delete_namespaced_custom_object(GROUP, VERSION, trainings.namespace, PLURAL, name)

    def gone() -> bool:
        services = trainings.core.list_namespaced_service(trainings.namespace).items
        return not pytorchjobs(trainings, name) and not trainings.pods(name) and not services

    wait_for(f"every child of {name} to be deleted", gone, 180, POLL_S)


# ----------------------------------------------------------------------------- eviction (Job backend)


def test_an_evicted_pod_restarts_the_gang_without_consuming_a_restart(trainings: Trainings,
                                                                      shared_output: str) -> None:
    name = "evicted"
    # maxRestarts 0: if the eviction counted, the training would fail. 8 epochs: the eviction, after the
    # operator's poll sees epoch 1, lands while it trains (with 3, the faster trainer had finished).
    spec = {**LONGER_SPEC, "epochs": 8, "maxRestarts": 0,
            "output": {"persistentVolumeClaim": {"claimName": shared_output}}}
    trainings.create(name, spec)
    trainings.wait_epoch(name, 1)
    trainings.evict(pod_of_rank(trainings.pods(name), 1))

    status = trainings.wait_phase(name, "Succeeded")
    assert (status["restarts"], status["disruptions"]) == (1, 1), status
    # The evicted pod itself is read when the operator sees it before it goes; else the Job's condition;
    # or, when its peer's exit 75 (it stopped with it, after the step checkpoint) failed the Job first,
    # that peer: Stopped. None of them counts.
    assert status["lastFailure"]["cause"] in ("Evicted", "Disrupted", "Stopped"), status


# ----------------------------------------------------------------------------- Kueue, real controller

# Room for one SMALL training (2 pods x 800m) at a time.
QUOTA_CPU = "1700m"


@pytest.fixture
def queue(kueue: None, trainings: Trainings) -> Iterator[str]:
    """A ClusterQueue with room for one training, its LocalQueue in the test's namespace, and two
    WorkloadPriorityClasses (low, high). Removed afterwards."""
    group, version = KUEUE_API
    custom, ns = trainings.custom, trainings.namespace
    flavor, cq = f"{ns}-flavor", f"{ns}-cq"
    objects = [
        ("resourceflavors", None, {"metadata": {"name": flavor}, "spec": {}}),
        ("clusterqueues", None, {"metadata": {"name": cq}, "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{
                "name": flavor, "resources": [{"name": "cpu", "nominalQuota": QUOTA_CPU},
                                              {"name": "memory", "nominalQuota": "8Gi"}]}]}]}}),
        ("localqueues", ns, {"metadata": {"name": "team", "namespace": ns}, "spec": {"clusterQueue": cq}}),
        ("workloadpriorityclasses", None, {"metadata": {"name": f"{ns}-low"}, "value": 10}),
        ("workloadpriorityclasses", None, {"metadata": {"name": f"{ns}-high"}, "value": 1000}),
    ]
    for plural, namespace, body in objects:
        kind = {"resourceflavors": "ResourceFlavor", "clusterqueues": "ClusterQueue",
                "localqueues": "LocalQueue", "workloadpriorityclasses": "WorkloadPriorityClass"}[plural]
        body = {"apiVersion": f"{group}/{version}", "kind": kind, **body}
        if namespace:
            custom.create_namespaced_custom_object(group, version, namespace, plural, body)
        else:
            custom.create_cluster_custom_object(group, version, plural, body)
    try:
        yield "team"
    finally:
        for plural, namespace, body in reversed(objects):
            if namespace is None:
                custom.delete_cluster_custom_object(group, version, plural, body["metadata"]["name"])


def queued(trainings: Trainings, queue: str, priority: str | None = None) -> dict[str, str]:
    labels = {"kueue.x-k8s.io/queue-name": queue}
    if priority:
        labels["kueue.x-k8s.io/priority-class"] = f"{trainings.namespace}-{priority}"
    return labels


def test_kueue_queues_the_second_training_until_the_first_is_done(trainings: Trainings, queue: str) -> None:
    spec = {**SMALL_SPEC, "epochs": 2}
    # The first runs a few minutes: a queued training's status follows Kueue's Workload on the 30 s
    # idle poll, and with two workers a 2-epoch SMALL_SPEC was done (and the second admitted) before
    # its status had shown why it waited.
    trainings.create("first", {**LONGER_SPEC, "epochs": 3}, queued(trainings, queue))
    trainings.wait_phase("first", "Running", 300)
    trainings.create("second", spec, queued(trainings, queue))
    status = trainings.wait_phase("second", "Queued", 120)
    # Kueue's own words, mirrored: why it waits (its Workload's QuotaReserved message), and which queue.
    seen: dict[str, Any] = {}

    def kueue_says_why() -> bool:
        seen.update(trainings.status("second"))
        return bool((seen.get("queue") or {}).get("workload")) and "quota" in (seen.get("message") or "")
    try:
        wait_for("second's message to carry Kueue's reason", kueue_says_why, 240, POLL_S)
    except pytest.fail.Exception as timed_out:
        pytest.fail(f"{timed_out}\nstatus: {seen}\n{trainings.describe('second')}")
    status = trainings.status("second")
    assert status["queue"]["name"] == queue and status["queue"]["admitted"] is False, status
    (job,) = trainings.jobs("second")
    assert job.spec.suspend is True
    assert trainings.status("first")["phase"] in ("Running", "Succeeded")

    trainings.wait_phase("first", "Succeeded")
    status = trainings.wait_phase("second", "Succeeded")
    assert status["restarts"] == 0 and status["queue"]["admitted"] is True, status


def test_kueue_preemption_is_not_a_failure_and_resumes_from_the_checkpoint(
        trainings: Trainings, queue: str, shared_output: str) -> None:
    # Six epochs: Kueue's preemption must land mid-run. With four, a faster trainer finished before it
    # and the second run had nothing to resume; CI's rehearsal saw it land at step 30 (epoch 1.5).
    output = {"persistentVolumeClaim": {"claimName": shared_output}}
    low_spec = {**LONGER_SPEC, "epochs": 6, "output": output}
    trainings.create("low", low_spec, queued(trainings, queue, "low"))
    trainings.wait_epoch("low", 1)
    wait_for("low's checkpoint", lambda: trainings.status("low").get("lastCheckpoint"), 120, POLL_S)

    trainings.create("high", {**SMALL_SPEC, "epochs": 1}, queued(trainings, queue, "high"))
    seen: list[str] = []
    status = phases_seen(trainings, "low", "Preempted", seen, 180)
    assert "preempted by Kueue" in status["message"] and status["restarts"] == 0, status
    trainings.wait_phase("high", "Succeeded")

    status = phases_seen(trainings, "low", "Succeeded", seen)
    assert status["restarts"] == 0 and status["epoch"] == 6, status
    assert "Preempted" in seen and seen[-1] == "Succeeded", seen
    logs = pod_logs(trainings.namespace, pod_of_rank(trainings.pods("low"), 0).metadata.name)
    assert "resume: continuing" in logs, logs[-3000:]  # after an epoch, or at the step saved on SIGTERM
    # Two runs of attempt 0 (Kueue's suspension stopped the first, which saved on SIGTERM): the second
    # resumed where the first was last read or later, so no step was done twice.
    runs = status["goodput"]["attempts"]
    print(f"kueue preemption: goodput {status['goodput']}")
    assert [run["attempt"] for run in runs] == [0, 0], runs
    assert runs[1]["firstStep"] >= runs[0]["lastStep"] > 0 and runs[0]["lostSteps"] == 0, runs
    events = kubectl("-n", trainings.namespace, "get", "events", "--field-selector",
                     "involvedObject.name=low,reason=Preempted", "-o", "name").stdout.split()
    assert len(events) == 1, events


def test_kueue_admits_a_pytorchjob_training(trainings: Trainings, queue: str, kubeflow: None) -> None:
    """Kueue's kubeflow.org/pytorchjob integration (switched on by the harness): the PyTorchJob is
    created suspended with the queue's label, Kueue admits it through runPolicy.suspend."""
    name = "pj-queued"
    trainings.create(name, {**SMALL_SPEC, "backend": "pytorchjob", "epochs": 1}, queued(trainings, queue))
    (pj,) = wait_for("the PyTorchJob", lambda: pytorchjobs(trainings, name), 60, POLL_S)
    assert pj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == queue
    status = trainings.wait_phase(name, "Succeeded")
    assert status["backend"] == "pytorchjob" and status["queue"]["admitted"] is True, status
