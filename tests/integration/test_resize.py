"""Against a real API server with the operator running: `kubectl scale` resizes a running training through
the CRD's scale subresource (the test plays the job controller), within spec.elastic; `kubectl get pt`
shows the size it runs at and the size asked for."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from conftest import job_pod, tool
from kubernetes import client
from pets_operator import api
from polling import wait_for
from test_operator_lifecycle import create_training, get_training, jobs, now, run_job, the_job
from test_placement_and_node_loss import bound_pod, lost_node, pod_gone  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration


def kubectl(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("kubectl"), "--kubeconfig", kubeconfig, *args], capture_output=True,
                          text=True, timeout=60, check=False)


def _status(admin: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    return dict(((get_training(admin, ns, name) or {}).get("status")) or {})


def test_kubectl_scale_resizes_a_running_training(admin: client.ApiClient, operator: Any, namespace: str,
                                                  kubeconfig: str) -> None:
    create_training(admin, namespace, "elastic", replicas=2, elastic={"minReplicas": 1, "maxReplicas": 2})
    first = the_job(admin, namespace, "elastic")
    assert first.spec.parallelism == 2
    run_job(admin, namespace, "elastic", 2)
    wait_for("status.workloadActive", lambda: _status(admin, namespace, "elastic").get("workloadActive"))

    # The scale subresource reads status.replicas and the pods' selector.
    scale = json.loads(kubectl(kubeconfig, "get", "--raw", f"/apis/{api.GROUP}/{api.VERSION}/namespaces/"
                               f"{namespace}/{api.PLURAL}/elastic/scale").stdout)
    assert scale["spec"]["replicas"] == 2 and scale["status"]["replicas"] == 2
    assert scale["status"]["selector"] == ("training.pets.dev/training=elastic,"
                                           "app.kubernetes.io/component=trainer")

    # Out of spec.elastic: refused by the CRD's rule, naming the field, through the subresource too.
    out = kubectl(kubeconfig, "scale", "pt", "elastic", "-n", namespace, "--replicas", "4")
    assert out.returncode != 0 and "spec.replicas must be within spec.elastic.minReplicas" in out.stderr
    assert _status(admin, namespace, "elastic")["globalBatch"] == 2 * 64  # batchSize x maxReplicas
    # Within it: taken while the workload runs; the gang is drained and attempt 1 built at the new size.
    out = kubectl(kubeconfig, "scale", "pt", "elastic", "-n", namespace, "--replicas", "1")
    assert out.returncode == 0, out.stderr
    wait_for("the 2-pod Job to go and a 1-pod one to replace it", lambda: [
        (j.metadata.name, j.spec.parallelism) for j in jobs(admin, namespace)] == [("elastic-r1", 1)])
    st = wait_for("status.replicas at the new size", lambda: (
        s if (s := _status(admin, namespace, "elastic")).get("replicas") == 1 else None))
    assert (st["attempt"], st["restarts"], st["replicas"]) == (1, 0, 1)
    # The same checkpoint directory at both sizes: the new gang resumes from the old one's SIGTERM save.
    jobs_made = (first, the_job(admin, namespace, "elastic-r1"))
    args = [list(j.spec.template.spec.containers[0].args) for j in jobs_made]
    assert len({a[a.index("--checkpoint-dir") + 1] for a in args}) == 1
    assert args[0][args[0].index("--checkpoint-dir") + 1] == st["checkpointDir"]
    assert st["resize"]["from"] == 2 and st["resize"]["to"] == 1 and st["resize"]["reason"] == "Scaled"
    events = client.CoreV1Api(admin).list_namespaced_event(namespace, field_selector="reason=Resized").items
    assert [e.message.split(":")[0] for e in events] == ["2 -> 1 (Scaled)"]

    # The new gang runs: the resize is over, booked as resizing time, and each run's world size is listed.
    run_job(admin, namespace, "elastic-r1", 1)
    wait_for("the resize to settle", lambda: "resize" not in _status(admin, namespace, "elastic"))
    assert _status(admin, namespace, "elastic")["goodput"]["resizingSeconds"] > 0
    got = kubectl(kubeconfig, "get", "pt", "elastic", "-n", namespace)
    header, row = got.stdout.strip().splitlines()
    assert header.split()[:4] == ["NAME", "PHASE", "REPLICAS", "DESIRED"]
    assert row.split()[2:4] == ["1", "1"]


def test_a_run_a_resize_stops_is_booked_from_rank_0s_summary_after_its_pod_is_gone(
        admin: client.ApiClient, operator: Any, namespace: str) -> None:
    """Rank 0 writes its summary on SIGTERM and its pod goes at once: kopf's index drops it, and the round
    that follows still books the run's split (ended_runs.py). A finalizer of the test's holds the pod, as
    the kubelet's grace period would, while the test writes what the kubelet would."""
    create_training(admin, namespace, "drained", replicas=2, elastic={"minReplicas": 1})
    job = the_job(admin, namespace, "drained")
    run_job(admin, namespace, "drained", 2)
    started = now()
    core = client.CoreV1Api(admin)
    container = {"name": "trainer", "image": "trainer", "imageID": "", "restartCount": 0}
    pod = job_pod(admin, namespace, job, 0, {"phase": "Running", "containerStatuses": [
        {**container, "ready": True, "state": {"running": {"startedAt": started}}}]})
    core.patch_namespaced_pod(pod, namespace, {"metadata": {"finalizers": ["test.pets.dev/hold"]}})
    wait_for("the run listed, before any progress read", lambda: _status(admin, namespace, "drained").get(
        "goodput", {}).get("attempts") == [{"attempt": 0, "startedAt": started, "worldSize": 2}])

    client.CustomObjectsApi(admin).patch_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, "drained", {"spec": {"replicas": 1}})
    wait_for("the garbage collector to delete rank 0's pod", lambda: core.read_namespaced_pod(
        pod, namespace).metadata.deletion_timestamp)
    split = {"startup": 4.0, "train": 30.0, "eval": 1.0, "checkpoint": 0.5, "restore": 0.0}
    summary = {"status": "stopped", "global_step": 60, "resume_step": 0, "time_seconds": split}
    stopped = {"exitCode": 75, "reason": "Error", "startedAt": started, "finishedAt": now(),
               "message": json.dumps(summary)}
    core.patch_namespaced_pod_status(pod, namespace, {"status": {"phase": "Failed", "containerStatuses": [
        {**container, "ready": False, "state": {"terminated": stopped}}]}})
    core.patch_namespaced_pod(pod, namespace, {"metadata": {"finalizers": None}})
    run = wait_for("the stopped run's split booked", lambda: next(
        (r for r in _status(admin, namespace, "drained").get("goodput", {}).get("attempts", [])
         if r["attempt"] == 0 and "trainSeconds" in r), None))
    assert run == {"attempt": 0, "startedAt": started, "worldSize": 2, "firstStep": 0, "startupSeconds": 4.0,
                   "trainSeconds": 30.0, "evalSeconds": 1.0, "checkpointSeconds": 0.5, "restoreSeconds": 0.0,
                   "lastStep": 60}
    assert _status(admin, namespace, "drained")["goodput"]["productiveSeconds"] == 30.0


def test_after_a_node_loss_it_goes_on_at_the_size_that_was_placed(
        admin: client.ApiClient, operator: Any, namespace: str, lost_node: str) -> None:  # noqa: F811
    create_training(admin, namespace, "shrinks", replicas=2, maxRestarts=0, elastic={"minReplicas": 1},
                    placement={"nodeLostSeconds": 1})
    job = the_job(admin, namespace, "shrinks")
    rank0, rank1 = (bound_pod(admin, namespace, job, i, lost_node) for i in (0, 1))
    run_job(admin, namespace, "shrinks", 2)
    wait_for("the training to run", lambda: _status(admin, namespace, "shrinks").get("phase") == api.RUNNING)
    client.CoreV1Api(admin).delete_namespaced_pod(rank1, namespace)  # the taint manager's eviction
    wait_for("the old pods to be force-deleted",
             lambda: pod_gone(admin, namespace, rank0) and pod_gone(admin, namespace, rank1))
    # The gang restarts; only one of its two pods is placed (the node is gone): after nodeLostSeconds the
    # operator goes on with one.
    restarted = the_job(admin, namespace, "shrinks-r1")
    assert restarted.spec.parallelism == 2
    bound_pod(admin, namespace, restarted, 0, lost_node + "-peer")
    bound_pod(admin, namespace, restarted, 1, None)
    smaller = wait_for("the gang rebuilt at 1", lambda: next(
        (j for j in jobs(admin, namespace) if j.metadata.name == "shrinks-r2"), None), 60)
    assert smaller.spec.parallelism == smaller.spec.completions == 1
    st = wait_for("status.resize", lambda: (s if (s := _status(admin, namespace, "shrinks")).get(
        "resize", {}).get("to") == 1 else None))
    assert st["resize"]["reason"] == "NodeLost" and (st["resize"]["from"], st["resize"]["to"]) == (2, 1)
    assert st["restarts"] == 1 and st["lastFailure"]["cause"] == "NodeLost"
    pt = get_training(admin, namespace, "shrinks") or {}
    assert pt["spec"]["replicas"] == 2  # the size asked for stays: the next attempt tries it again
    events = client.CoreV1Api(admin).list_namespaced_event(namespace, field_selector="reason=Resized").items
    assert [e.message.split(":")[0] for e in events] == ["2 -> 1 (NodeLost)"]


def test_kueue_admitting_fewer_pods_rebuilds_the_workload_at_that_size(
        admin: client.ApiClient, operator: Any, namespace: str) -> None:
    body = {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": "partial", "labels": {api.KUEUE_QUEUE_LABEL: "team-a"}},
            "spec": {"backend": "job", "replicas": 2, "elastic": {"minReplicas": 1}}}
    client.CustomObjectsApi(admin).create_namespaced_custom_object(api.GROUP, api.VERSION, namespace,
                                                                   api.PLURAL, body)
    queued = the_job(admin, namespace, "partial")
    assert queued.spec.suspend is True
    assert queued.metadata.annotations["kueue.x-k8s.io/job-min-parallelism"] == "1"
    assert queued.metadata.annotations["kueue.x-k8s.io/job-completions-equal-parallelism"] == "true"
    # Kueue, with quota for one pod, admits it at one (RunWithPodSetsInfo): parallelism, completions and
    # suspend in one write. The pods' world size is still 2: the operator rebuilds the workload at 1.
    client.BatchV1Api(admin).patch_namespaced_job("partial", namespace, {"spec": {
        "parallelism": 1, "completions": 1, "suspend": False}}, field_manager="kueue-stand-in")
    rebuilt = wait_for("the workload rebuilt at the admitted size", lambda: next(
        (j for j in jobs(admin, namespace) if j.metadata.name == "partial-r1"), None), 60)
    assert rebuilt.spec.parallelism == 1 and rebuilt.spec.suspend is True  # queued again, admitted whole
    assert rebuilt.metadata.annotations["training.pets.dev/world-size"] == "1"
    env = {e.name: e.value for e in rebuilt.spec.template.spec.containers[0].env}
    assert env["PETS_NUM_MACHINES"] == "1"
    st = wait_for("status.resize", lambda: (s if (s := _status(admin, namespace, "partial")).get(
        "resize", {}).get("to") == 1 else None))
    assert st["resize"]["reason"] == "PartialAdmission" and st["resize"]["to"] == 1
