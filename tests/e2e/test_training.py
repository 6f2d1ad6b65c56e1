"""End to end: the chart, the operator and the trainer on a real cluster, on CPU.

Run by tests/e2e/run.sh (`make e2e`) after the images are built and loaded into the node:
helm installs the chart, each test applies a small PetsTraining in its own namespace and
watches it through the real API server while real pods train across two machine ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import cache_dir, cluster_kubeconfig  # tests/e2e/conftest.py (pytest puts its dir on sys.path)
from polling import wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "training.pets.dev", "v1alpha1", "petstrainings"
RELEASE = "pets"
OPERATOR_NAMESPACE = os.environ.get("PETS_E2E_OPERATOR_NAMESPACE", "pets-system")
TRAIN_TIMEOUT_S = int(os.environ.get("PETS_E2E_TRAIN_TIMEOUT", "900"))

# Small enough to train in a couple of minutes on two CPU pods of one 2-core node.
SMALL_SPEC: dict[str, Any] = {
    "replicas": 2,
    "processesPerReplica": 1,
    "epochs": 2,
    "batchSize": 16,
    "imageSize": 64,
    "model": "resnet18",
    "mixedPrecision": "bf16",
    "dataset": {"synthetic": {"numClasses": 4, "imagesPerClass": 24}},
    "resources": {"cpu": "800m", "memory": "2Gi"},
    "maxRestarts": 2,
}
# Epochs of 10-20 s here: longer than the operator's 10 s progress poll, so status shows an epoch
# while Running, and the fault tests can act mid-run.
LONGER_SPEC: dict[str, Any] = {**SMALL_SPEC, "imageSize": 128,
                               "dataset": {"synthetic": {"numClasses": 4, "imagesPerClass": 600}}}


# ----------------------------------------------------------------------------- helpers


def kubectl(*args: str, check: bool = True,
            input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(cluster_kubeconfig())}
    return subprocess.run(["kubectl", *args], env=env, text=True, capture_output=True,
                          input=input_text, check=check)


def helm_binary() -> str:
    candidate = cache_dir() / "bin" / "helm"
    return str(candidate) if candidate.is_file() else "helm"


POLL_S = 2.0  # the cluster's API and kubectl, polled on a 2-core machine that also trains


class Trainings:
    """The PetsTrainings of one namespace, through the real API server."""

    def __init__(self, api: Any, namespace: str) -> None:
        from kubernetes import client

        self.namespace = namespace
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)

    def create(self, name: str, spec: dict[str, Any]) -> None:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PetsTraining",
                "metadata": {"name": name}, "spec": spec}
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)

    def get(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def status(self, name: str) -> dict[str, Any]:
        return self.get(name).get("status") or {}

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name,
                                                   {"spec": spec})

    def wait_phase(self, name: str, phase: str, timeout_s: float = TRAIN_TIMEOUT_S) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            status = self.status(name)
            if status.get("phase") == "Failed" and phase != "Failed":
                pytest.fail(f"{self.namespace}/{name} Failed: {json.dumps(status, indent=1)}\n"
                            f"{self.describe(name)}")
            return status if status.get("phase") == phase else None
        return wait_for(f"{self.namespace}/{name} phase {phase}", probe, timeout_s, POLL_S)

    def wait_epoch(self, name: str, epoch: int, timeout_s: float = TRAIN_TIMEOUT_S) -> dict[str, Any]:
        return wait_for(f"{self.namespace}/{name} status.epoch >= {epoch}",
                        lambda: (s := self.status(name)) and (s.get("epoch") or 0) >= epoch and s,
                        timeout_s, POLL_S)

    def jobs(self, name: str) -> list[Any]:
        return self.batch.list_namespaced_job(
            self.namespace, label_selector=f"{GROUP}/training={name}").items

    def pods(self, name: str) -> list[Any]:
        return self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{GROUP}/training={name}").items

    def describe(self, name: str) -> str:
        """What a person would look at when a test fails: the objects and the pods' logs."""
        out = [kubectl("-n", self.namespace, "get", "pt,job,svc,pod", "-o", "wide", check=False).stdout,
               kubectl("-n", self.namespace, "get", "events", "--sort-by=.lastTimestamp",
                       check=False).stdout[-4000:]]
        for pod in self.pods(name):
            logs = kubectl("-n", self.namespace, "logs", pod.metadata.name, "--tail=40", check=False)
            out.append(f"--- {pod.metadata.name}\n{logs.stdout}{logs.stderr}")
        return "\n".join(out)


def pod_logs(namespace: str, pod: str) -> str:
    return kubectl("-n", namespace, "logs", pod).stdout


def pod_of_rank(pods: list[Any], rank: int) -> Any:
    for pod in pods:
        if pod.metadata.annotations.get("batch.kubernetes.io/job-completion-index") == str(rank):
            return pod
    pytest.fail(f"no pod of completion index {rank} among {[p.metadata.name for p in pods]}")


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def operator_release(kube_api: Any) -> Iterator[str]:
    """The chart installed with helm, its operator Deployment rolled out. Uninstalled afterwards."""
    helm = helm_binary()
    env = {**os.environ, "KUBECONFIG": str(cluster_kubeconfig())}
    subprocess.run([helm, "upgrade", "--install", RELEASE, str(REPO / "charts" / "pets-training"),
                    "--namespace", OPERATOR_NAMESPACE, "--create-namespace",
                    "--set", "image.pullPolicy=IfNotPresent", "--wait", "--timeout", "5m"],
                   env=env, check=True)
    yield RELEASE
    subprocess.run([helm, "uninstall", RELEASE, "--namespace", OPERATOR_NAMESPACE, "--wait"],
                   env=env, check=False)


@pytest.fixture
def trainings(kube_api: Any, operator_release: str) -> Iterator[Trainings]:
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    wait_for(f"namespace {name} default ServiceAccount",
             lambda: core.list_namespaced_service_account(
                 name, field_selector="metadata.name=default").items, 60, 0.5)
    trainings = Trainings(kube_api, name)
    try:
        yield trainings
    finally:
        core.delete_namespace(name, propagation_policy="Foreground")


@pytest.fixture
def shared_output(kube_api: Any, trainings: Trainings) -> Iterator[str]:
    """A ReadWriteMany claim on a hostPath volume of the node: checkpoints outlive the pods."""
    from kubernetes import client

    claim = "pets-output"
    pv_name = f"{trainings.namespace}-output"
    host_dir = Path(os.environ.get("PETS_STATE", "/tmp/pets-training-cluster")) / "volumes" / pv_name
    pv = {"apiVersion": "v1", "kind": "PersistentVolume",
          "metadata": {"name": pv_name},
          "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteMany"],
                   "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                   "hostPath": {"path": str(host_dir), "type": "DirectoryOrCreate"},
                   "claimRef": {"namespace": trainings.namespace, "name": claim}}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
           "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv_name,
                    "resources": {"requests": {"storage": "2Gi"}}}}
    kubectl("apply", "-f", "-", input_text=yaml.safe_dump(pv))
    kubectl("-n", trainings.namespace, "apply", "-f", "-", input_text=yaml.safe_dump(pvc))
    # The trainer runs as uid 1000: the volume's directory must be writable by it.
    host_dir.mkdir(parents=True, exist_ok=True)
    os.chown(host_dir, 1000, 1000)
    yield claim
    client.CoreV1Api(kube_api).delete_persistent_volume(pv_name)


# ----------------------------------------------------------------------------- tests


def test_training_succeeds_across_two_ranks(trainings: Trainings) -> None:
    name = "pets"
    spec = LONGER_SPEC
    trainings.create(name, spec)

    seen_epochs: dict[int, float] = {}

    def progressed() -> dict[str, Any] | None:
        status = trainings.status(name)
        if status.get("phase") == "Running" and status.get("evalAccuracy") is not None:
            seen_epochs[int(status["epoch"])] = float(status["evalAccuracy"])
        if status.get("phase") == "Failed":
            pytest.fail(f"Failed: {status}\n{trainings.describe(name)}")
        return status if status.get("phase") == "Succeeded" else None

    status = wait_for(f"{name} Succeeded", progressed, TRAIN_TIMEOUT_S, 1.0)

    assert status["epoch"] == spec["epochs"] and status["totalEpochs"] == spec["epochs"]
    assert 0.0 <= status["evalAccuracy"] <= 1.0
    # Live progress was mirrored while training, not only the final summary.
    assert seen_epochs, f"status never showed a per-epoch accuracy while running: {status}"
    summary = status["summary"]
    assert summary["status"] == "succeeded" and summary["world_size"] == 2, summary
    assert summary["epochs"] == spec["epochs"], summary
    assert abs(summary["final_accuracy"] - status["evalAccuracy"]) < 1e-6, (summary, status)

    jobs = trainings.jobs(name)
    assert len(jobs) == 1, [j.metadata.name for j in jobs]
    pods = trainings.pods(name)
    for rank in (0, 1):
        logs = pod_logs(trainings.namespace, pod_of_rank(pods, rank).metadata.name)
        assert f"machine {rank} of 2" in logs, logs[-3000:]
    rank0 = pod_logs(trainings.namespace, pod_of_rank(pods, 0).metadata.name)
    assert "2 process(es)" in rank0, rank0[-3000:]


# Kills every process of the container but its PID 1 (the kernel ignores SIGKILL to a namespace's init
# from inside it): the training processes die as in a crash, the launcher sees it and exits non-zero.
CRASH = ("import os, signal\n"
         "for pid in [int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
         "    if pid not in (1, os.getpid()):\n"
         "        try: os.kill(pid, signal.SIGKILL)\n"
         "        except ProcessLookupError: pass\n")


def test_worker_crash_mid_training_restarts_gang_and_resumes(trainings: Trainings,
                                                             shared_output: str) -> None:
    name = "resume"
    spec = {**LONGER_SPEC, "epochs": 4, "output": {"persistentVolumeClaim": {"claimName": shared_output}}}
    trainings.create(name, spec)
    status = trainings.wait_epoch(name, 1)
    assert status["phase"] == "Running" and status["epoch"] < 4, f"not mid-run: {status}"
    checkpoint = wait_for(f"{name} status.lastCheckpoint",
                          lambda: trainings.status(name).get("lastCheckpoint"), 120, POLL_S)
    worker = pod_of_rank(trainings.pods(name), 1)
    kubectl("-n", trainings.namespace, "exec", worker.metadata.name, "--", "python3", "-c", CRASH,
            check=False)

    status = trainings.wait_phase(name, "Succeeded")
    assert status["restarts"] == 1, status
    assert status["epoch"] == 4, status
    failure = status["lastFailure"]
    assert (failure["rank"], failure["pod"]) == (1, worker.metadata.name), failure
    assert failure["cause"] == "ExitCode" and failure["exitCode"] != 0 and failure["node"], failure
    assert status["lastCheckpoint"]["epoch"] >= checkpoint["epoch"] >= 1, status
    jobs = trainings.jobs(name)
    assert len(jobs) == 1, [j.metadata.name for j in jobs]
    rank0 = pod_logs(trainings.namespace, pod_of_rank(trainings.pods(name), 0).metadata.name)
    assert "resume: continuing after epoch" in rank0, rank0[-3000:]


def test_operator_deleted_mid_run_keeps_one_job_and_resumes_status(trainings: Trainings,
                                                                   kube_api: Any) -> None:
    from kubernetes import client

    name = "operator-restart"
    trainings.create(name, {**LONGER_SPEC, "epochs": 3})
    trainings.wait_phase(name, "Running")
    core = client.CoreV1Api(kube_api)
    selector = "app.kubernetes.io/name=pets-training"
    old = {p.metadata.name
           for p in core.list_namespaced_pod(OPERATOR_NAMESPACE, label_selector=selector).items}
    assert old, f"no operator pod in {OPERATOR_NAMESPACE} with {selector}"
    for pod in old:
        core.delete_namespaced_pod(pod, OPERATOR_NAMESPACE)

    def new_operator_ready() -> bool:
        pods = core.list_namespaced_pod(OPERATOR_NAMESPACE, label_selector=selector).items
        return any(p.metadata.name not in old and p.status.phase == "Running"
                   and all(c.ready for c in (p.status.container_statuses or [])) for p in pods)

    wait_for("a new operator pod ready", new_operator_ready, 300, POLL_S)
    status = trainings.wait_phase(name, "Succeeded")
    assert status["epoch"] == 3, status
    assert len(trainings.jobs(name)) == 1


def test_invalid_training_is_rejected_at_apply(trainings: Trainings) -> None:
    bad = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PetsTraining", "metadata": {"name": "bad"},
           "spec": {**SMALL_SPEC, "replicas": 0}}
    result = kubectl("-n", trainings.namespace, "apply", "-f", "-", input_text=yaml.safe_dump(bad),
                     check=False)
    assert result.returncode != 0
    assert "spec.replicas" in result.stderr, result.stderr
    both = {**bad, "spec": {**SMALL_SPEC, "dataset": {"synthetic": {}, "hostPath": {"path": "/data"}}}}
    result = kubectl("-n", trainings.namespace, "apply", "-f", "-", input_text=yaml.safe_dump(both),
                     check=False)
    assert result.returncode != 0
    assert "spec.dataset" in result.stderr, result.stderr
    assert kubectl("-n", trainings.namespace, "get", "pt", "-o", "name").stdout.strip() == ""


def test_suspend_then_resume(trainings: Trainings) -> None:
    name = "suspend"
    trainings.create(name, {**LONGER_SPEC, "epochs": 3})
    trainings.wait_phase(name, "Running")
    trainings.patch_spec(name, {"suspend": True})
    trainings.wait_phase(name, "Suspended", 120)
    (job,) = trainings.jobs(name)
    assert job.spec.suspend is True
    wait_for("the suspended Job's pods to go", lambda: not [
        p for p in trainings.pods(name) if p.status.phase in ("Pending", "Running")], 120, POLL_S)

    trainings.patch_spec(name, {"suspend": False})
    status = trainings.wait_phase(name, "Succeeded")
    assert status["epoch"] == 3, status


def test_deleting_the_training_removes_every_child(trainings: Trainings) -> None:
    name = "delete-me"
    trainings.create(name, {**LONGER_SPEC, "epochs": 3})
    trainings.wait_phase(name, "Running")
    assert trainings.jobs(name)
    trainings.custom.delete_namespaced_custom_object(GROUP, VERSION, trainings.namespace, PLURAL, name)

    def gone() -> bool:
        services = trainings.core.list_namespaced_service(
            trainings.namespace, label_selector=f"{GROUP}/training={name}").items
        return not trainings.jobs(name) and not trainings.pods(name) and not services

    wait_for(f"every child of {name} to be deleted", gone, 180, POLL_S)


# ----------------------------------------------------------------------------- status that tells the truth

REASON_WITHIN_S = 60  # what the issue promises a user: the reason in status within a minute


@pytest.fixture
def empty_host_dir(trainings: Trainings) -> Iterator[str]:
    """An empty directory on the node (the local cluster's node shares this machine's filesystem)."""
    path = Path(os.environ.get("PETS_STATE", "/tmp/pets-training-cluster")) / "volumes" / \
        f"{trainings.namespace}-empty"
    path.mkdir(parents=True, exist_ok=True)
    yield str(path)


WAITING_ROWS = {
    "unschedulable": ({"resources": {"cpu": "64", "memory": "2Gi"}}, "Unschedulable", "Insufficient cpu"),
    "image": ({"image": "localhost/nope/trainer:0.0.1", "imagePullPolicy": "Never"}, "ImagePullFailed",
              "localhost/nope/trainer:0.0.1"),
    "claim": ({"dataset": {"persistentVolumeClaim": {"claimName": "no-such-claim"}}}, "VolumeNotReady",
              "no-such-claim"),
}


@pytest.mark.parametrize("row", list(WAITING_ROWS))
def test_waiting_training_says_why(trainings: Trainings, row: str) -> None:
    overrides, reason, words = WAITING_ROWS[row]
    trainings.create(row, {**SMALL_SPEC, **overrides})

    def says_why() -> dict[str, Any] | None:
        status = trainings.status(row)
        return status if status.get("phase") == "Pending" and words in (status.get("message") or "") else None

    try:
        status = wait_for(f"{row}: Pending with {words!r} in the message", says_why, REASON_WITHIN_S, POLL_S)
    except pytest.fail.Exception as timed_out:
        pytest.fail(f"{timed_out}\n{trainings.status(row)}\n{trainings.describe(row)}")
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == reason, status
    events = kubectl("-n", trainings.namespace, "get", "events", "--field-selector",
                     f"involvedObject.name={row},reason={reason}", "-o", "name").stdout.split()
    assert len(events) == 1, f"one Event per new reason, got {events}"


def test_bad_model_fails_at_once_without_restarts(trainings: Trainings) -> None:
    trainings.create("bad-model", {**SMALL_SPEC, "model": "resnet9000"})
    status = trainings.wait_phase("bad-model", "Failed", REASON_WITHIN_S)
    assert status["restarts"] == 0, status
    assert "resnet9000" in status["message"], status
    assert status["lastFailure"]["cause"] == "PermanentError", status


def test_empty_dataset_fails_at_once_without_restarts(trainings: Trainings, empty_host_dir: str) -> None:
    trainings.create("empty-data", {**SMALL_SPEC, "dataset": {"hostPath": {"path": empty_host_dir}}})
    status = trainings.wait_phase("empty-data", "Failed", REASON_WITHIN_S)
    assert status["restarts"] == 0, status
    assert "empty" in status["message"], status
    assert status["lastFailure"]["cause"] == "PermanentError", status
