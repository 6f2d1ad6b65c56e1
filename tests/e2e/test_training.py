"""End to end: the chart, the operator and the trainer on a real cluster, on CPU.

Run by tests/e2e/run.sh (`make e2e`) after the images are built and loaded into the node:
helm installs the chart, each test applies a small PetsTraining in its own namespace and
watches it through the real API server while real pods train across two machine ranks.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from faults import active_peer, kill_operator, operator_replicas
from polling import wait_for
from trainings import (  # tests/e2e/trainings.py (pytest puts this dir on sys.path)
    GROUP,
    LONGER_SPEC,
    OPERATOR_NAMESPACE,
    PLURAL,
    POLL_S,
    SMALL_SPEC,
    TRAIN_TIMEOUT_S,
    VERSION,
    Trainings,
    kubectl,
    pod_logs,
    pod_of_rank,
)

pytestmark = pytest.mark.e2e



# ----------------------------------------------------------------------------- tests


def test_training_succeeds_across_two_ranks(trainings: Trainings) -> None:
    name = "pets"
    # 5 epochs: the trainer now runs LONGER_SPEC's 2 in about 14 s, inside one 10 s progress poll or two
    spec = {**LONGER_SPEC, "epochs": 5}
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
    # No spec.output: the work is on the claim the operator made, and the status says so.
    durable = next(c for c in status["conditions"] if c["type"] == "OutputDurable")
    assert (durable["status"], durable["reason"]) == ("True", "ManagedClaim"), durable
    assert "spec.output is unset" in durable["message"] and f"{name}-output" in durable["message"], durable
    assert (status["outputReason"], list(status["output"])) == ("OperatorDefault", ["managedClaim"]), status
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
    # 10 epochs: the crash, after the operator's 10 s poll has seen epoch 1 and a checkpoint, lands while
    # it trains (4 took 19 s in all, and one CI run found it Succeeded at its first look).
    spec = {**LONGER_SPEC, "epochs": 10, "output": {"persistentVolumeClaim": {"claimName": shared_output}}}
    trainings.create(name, spec)
    status = trainings.wait_epoch(name, 1)
    assert status["phase"] == "Running" and status["epoch"] < spec["epochs"], f"not mid-run: {status}"
    checkpoint = wait_for(f"{name} status.lastCheckpoint",
                          lambda: trainings.status(name).get("lastCheckpoint"), 120, POLL_S)
    worker = pod_of_rank(trainings.pods(name), 1)
    kubectl("-n", trainings.namespace, "exec", worker.metadata.name, "--", "python3", "-c", CRASH,
            check=False)

    status = trainings.wait_phase(name, "Succeeded")
    assert status["restarts"] == 1, status
    assert status["epoch"] == spec["epochs"], status
    failure = status["lastFailure"]
    assert (failure["rank"], failure["pod"]) == (1, worker.metadata.name), failure
    assert failure["cause"] == "ExitCode" and failure["exitCode"] != 0 and failure["node"], failure
    assert status["lastCheckpoint"]["epoch"] >= checkpoint["epoch"] >= 1, status
    jobs = trainings.jobs(name)
    assert len(jobs) == 1, [j.metadata.name for j in jobs]
    rank0 = pod_logs(trainings.namespace, pod_of_rank(trainings.pods(name), 0).metadata.name)
    # after an epoch, or at a step checkpoint that came after it (every 60 s by default)
    assert "resume: continuing" in rank0, rank0[-3000:]


# Alone, after the others (tests/e2e/run.sh): every training waits on the operator while it is gone.
@pytest.mark.cluster_wide
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


# Alone, after the others: the operator stops acting for a while.
@pytest.mark.cluster_wide
def test_a_standby_operator_takes_over_when_the_active_one_is_killed(trainings: Trainings,
                                                                     kube_api: Any) -> None:
    """The chart's replicaCount: 2 (kopf peering): the acting replica is SIGKILLed, so it never leaves the
    peering object; its container restarts under the same identity. An operator acts again at once, the
    training keeps its one Job and Succeeds."""
    import time
    from datetime import UTC, datetime

    from kubernetes import client

    with operator_replicas(2):
        custom = client.CustomObjectsApi(kube_api)
        name = "failover"
        trainings.create(name, {**LONGER_SPEC, "epochs": 6})
        trainings.wait_epoch(name, 1)
        active, _ = active_peer(custom)
        killed_at = datetime.now(UTC)
        started = time.monotonic()
        kill_operator(active)

        def written_after_the_kill() -> bool:
            as_of = (trainings.status(name).get("goodput") or {}).get("asOf")
            return bool(as_of) and datetime.fromisoformat(str(as_of).replace("Z", "+00:00")) > killed_at
        wait_for("an operator to write the training's status again", written_after_the_kill, 180, 1.0)
        took = time.monotonic() - started
        print(f"[failover] the acting {active} SIGKILLed; {active_peer(custom)[0]} acts, and wrote the "
              f"training's status {took:.0f} s after the kill")
        status = trainings.wait_phase(name, "Succeeded")
        assert status["restarts"] == 0 and len(trainings.jobs(name)) == 1, status
        # Bounded by kopf's peering lifetime (60 s), should the killed record outlive its container, plus
        # one progress poll (10 s) and the API's latency.
        assert took < 90, f"no operator acted for {took:.0f} s"


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


def _tiny_quota(trainings: Trainings) -> None:
    kubectl("-n", trainings.namespace, "create", "quota", "tiny", "--hard=requests.cpu=200m")
    # Until the quota controller has counted the namespace, a pod is refused as "status unknown".
    wait_for("quota tiny counted", lambda: kubectl("-n", trainings.namespace, "get", "quota", "tiny", "-o",
                                                   "jsonpath={.status.hard}").stdout.strip(), 30, POLL_S)


def _restricted(trainings: Trainings) -> None:
    kubectl("label", "namespace", trainings.namespace, "pod-security.kubernetes.io/enforce=restricted")


# Why pods wait, one row each: what the namespace needs first (or None), the spec's overrides, the
# Progressing reason, the words the message must hold, and within how long. The last four are pods the
# API server refuses to create (issue 21): the Job exists, its pods never do, and the only trace is the
# Job's FailedCreate Events; the message says whether waiting helps (a quota) or a person must act.
WaitingRow = tuple[Callable[[Trainings], None] | None, dict[str, Any], str, tuple[str, ...], int]
WAITING_ROWS: dict[str, WaitingRow] = {
    "unschedulable": (None, {"resources": {"cpu": "64", "memory": "2Gi"}}, "Unschedulable",
                      ("Insufficient cpu",), REASON_WITHIN_S),
    "image": (None, {"image": "localhost/nope/trainer:0.0.1", "imagePullPolicy": "Never"}, "ImagePullFailed",
              ("localhost/nope/trainer:0.0.1",), REASON_WITHIN_S),
    "claim": (None, {"dataset": {"persistentVolumeClaim": {"claimName": "no-such-claim"}}}, "VolumeNotReady",
              ("no-such-claim",), REASON_WITHIN_S),
    "quota": (_tiny_quota, {}, "PodCreateRefused", ("exceeded quota: tiny", "quota's usage drops"), 30),
    "pod-security": (_restricted, {"dataset": {"hostPath": {"path": "/srv/pets"}}}, "PodCreateRefused",
                     ("violates PodSecurity", "a person must"), 30),
    "service-account": (None, {"serviceAccountName": "nope"}, "PodCreateRefused",
                        ('serviceaccount "nope" not found', "a person must"), 30),
    "priority-class": (None, {"priorityClassName": "nope"}, "PodCreateRefused",
                       ("no PriorityClass with name nope", "a person must"), 30),
}


@pytest.mark.parametrize("row", list(WAITING_ROWS))
def test_waiting_training_says_why(trainings: Trainings, row: str) -> None:
    prepare, overrides, reason, words, within_s = WAITING_ROWS[row]
    if prepare is not None:
        prepare(trainings)
    trainings.create(row, {**SMALL_SPEC, **overrides})

    def says_why() -> dict[str, Any] | None:
        status = trainings.status(row)
        message = status.get("message") or ""
        return status if status.get("phase") == "Pending" and all(w in message for w in words) else None

    try:
        status = wait_for(f"{row}: Pending with {words!r} in the message", says_why, within_s, POLL_S)
    except pytest.fail.Exception as timed_out:
        pytest.fail(f"{timed_out}\n{trainings.status(row)}\n{trainings.describe(row)}")
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == reason, status
    events = kubectl("-n", trainings.namespace, "get", "events", "--field-selector",
                     f"involvedObject.name={row},reason={reason}", "-o", "name").stdout.split()
    assert len(events) == 1, f"one Event per new reason, got {events}"


def test_the_deadline_ends_the_training_without_a_restart_or_a_second_job(trainings: Trainings) -> None:
    """activeDeadlineSeconds is the training's (issue 21): a 30 s deadline on a long training ends it
    Failed/DeadlineExceeded, restarts 0, attempt 0: the Job was never made again."""
    name = "deadline"
    trainings.create(name, {**LONGER_SPEC, "epochs": 50, "activeDeadlineSeconds": 30})
    status = trainings.wait_phase(name, "Failed", 240)
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "DeadlineExceeded", status
    assert status["restarts"] == 0 and status["attempt"] == 0, status
    assert "spec.activeDeadlineSeconds=30 ran out" in status["message"], status
    created = kubectl("-n", trainings.namespace, "get", "events", "--field-selector",
                      f"involvedObject.name={name},reason=Created", "-o", "name").stdout.split()
    assert len(created) == 1, f"one workload created, got Events {created}"


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


# ----------------------------------------------------------------------------- the pretrained default


def test_pretrained_resnet50d_from_a_hub_cache_volume_trains(trainings: Trainings,
                                                            hub_cache: str) -> None:
    """The recipe's own model with pretrained: true, its weights read offline from a cache volume."""
    name = "pretrained"
    spec = {**SMALL_SPEC, "model": "resnet50d", "pretrained": True, "epochs": 1,
            "pretrainedCache": {"persistentVolumeClaim": {"claimName": hub_cache}}}
    trainings.create(name, spec)
    status = trainings.wait_phase(name, "Succeeded")
    assert status["restarts"] == 0 and status["summary"]["model"] == "resnet50d", status
    rank0 = pod_logs(trainings.namespace, pod_of_rank(trainings.pods(name), 0).metadata.name)
    assert "from the hub cache /pretrained-cache (offline)" in rank0, rank0[-3000:]


def test_pretrained_without_the_hub_fails_at_once_naming_the_fields(trainings: Trainings) -> None:
    """No cache, no weights, and no hub (HF_ENDPOINT at a closed port, so this holds where there is
    internet too): Failed within a minute, no restart burned, and the way out in the message."""
    name = "no-hub"
    spec = {**SMALL_SPEC, "model": "resnet50d", "pretrained": True,
            "env": [{"name": "HF_ENDPOINT", "value": "http://127.0.0.1:9"}]}
    trainings.create(name, spec)
    status = trainings.wait_phase(name, "Failed", REASON_WITHIN_S)
    assert status["restarts"] == 0, status
    for field in ("spec.pretrained", "spec.weights", "spec.pretrainedCache"):
        assert field in status["message"], status["message"]
