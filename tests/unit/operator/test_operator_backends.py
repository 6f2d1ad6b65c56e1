"""Each backend as one object: what it builds, how its state reads, how it is chosen."""

from __future__ import annotations

import pytest
from operator_specs import TARGET, env_of, spec  # tests/unit/operator/operator_specs.py
from pets_operator import api, backends, builders, children

pytestmark = pytest.mark.unit

def test_job_backend_children_in_creation_order() -> None:
    children = backends.JOB.children(spec(), TARGET)
    # the Service, the policy and the claim before the pods
    assert [m["kind"] for m in children] == ["Service", "NetworkPolicy", "PersistentVolumeClaim", "Job"]
    assert backends.JOB.children_names("pets", 1) == {"service": "pets", "job": "pets-r1"}
    assert backends.for_kind("batch/v1", "Job") is backends.JOB
    assert backends.for_kind("v1", "Service") is None


def test_pytorchjob_workload() -> None:
    pj = backends.PYTORCHJOB.build_workload(spec(), TARGET)
    assert pj["apiVersion"] == "kubeflow.org/v1" and pj["kind"] == "PyTorchJob"
    assert backends.for_kind(pj["apiVersion"], pj["kind"]) is backends.PYTORCHJOB
    rs = pj["spec"]["pytorchReplicaSpecs"]
    assert rs["Master"]["replicas"] == 1 and rs["Worker"]["replicas"] == 2
    c = rs["Master"]["template"]["spec"]["containers"][0]
    assert c["name"] == "pytorch"
    assert {p["name"] for p in c["ports"]} >= {"pytorchjob-port"}
    env = env_of(c)
    assert "PETS_MAIN_ADDR" not in env  # MASTER_ADDR from the training-operator is the fallback
    assert env["PETS_NUM_MACHINES"] == "3"
    assert env["PETS_CPU_LIMIT"]["resourceFieldRef"]["containerName"] == "pytorch"
    assert "subdomain" not in rs["Master"]["template"]["spec"]
    assert rs["Master"]["template"] is not rs["Worker"]["template"]
    single = backends.PYTORCHJOB.build_workload(spec(replicas=1), TARGET)
    assert "Worker" not in single["spec"]["pytorchReplicaSpecs"]
    assert backends.PYTORCHJOB.children(spec(), TARGET) == [children.build_network_policy(spec(), TARGET),
                                                            children.build_output_claim(spec(), TARGET), pj]
    assert backends.PYTORCHJOB.children_names("pets", 0) == {"pytorchJob": "pets"}


def test_resolution() -> None:
    # auto runs as the operator's --auto-backend (job unless told) where that is served, else as a Job.
    assert backends.resolve(spec(), {"job", "pytorchjob"}) is backends.JOB
    assert backends.resolve(spec(), {"job", "pytorchjob"}, auto="pytorchjob") is backends.PYTORCHJOB
    assert backends.resolve(spec(), {"job"}, auto="pytorchjob") is backends.JOB
    assert backends.resolve(spec(), set()) is backends.JOB
    assert backends.resolve(spec(backend="job"), {"pytorchjob"}) is backends.JOB
    with pytest.raises(backends.BackendUnavailable, match="spec.backend is 'pytorchjob'.*training-operator"):
        backends.resolve(spec(backend="pytorchjob"), {"job"})
    with pytest.raises(api.SpecError, match="spec.backend must be one of auto, job, pytorchjob, got 'mpi'"):
        backends.get("mpi")


def test_why_names_the_reason() -> None:
    assert backends.why(spec(backend="pytorchjob"), backends.PYTORCHJOB) == "spec.backend is pytorchjob"
    assert "--auto-backend" in backends.why(spec(), backends.JOB)
    assert "CRD is not served, so job" in backends.why(spec(), backends.JOB, auto="pytorchjob")


@pytest.mark.parametrize("backend", list(backends.BACKENDS.values()), ids=list(backends.BACKENDS))
def test_queued_workloads_are_created_suspended_with_the_queue_labels(backend: backends.Backend) -> None:
    labels = builders.queue_labels({api.KUEUE_QUEUE_LABEL: "team-a", api.KUEUE_PRIORITY_LABEL: "high",
                                    "team": "vision"})
    assert labels == {api.KUEUE_QUEUE_LABEL: "team-a", api.KUEUE_PRIORITY_LABEL: "high"}
    queued = builders.Target("pets", "ns", queue_labels=labels)
    workload = backend.build_workload(spec(), queued)
    assert backend.is_suspended(workload)
    assert labels.items() <= workload["metadata"]["labels"].items()
    assert not backend.is_suspended(backend.build_workload(spec(), TARGET))


@pytest.mark.parametrize("backend", list(backends.BACKENDS.values()), ids=list(backends.BACKENDS))
def test_suspend_patch_round_trips(backend: backends.Backend) -> None:
    workload = backend.build_workload(spec(), TARGET)
    assert not backend.is_suspended(workload)
    patch = backend.suspend_patch(True)
    merged = {**workload, "spec": {**workload["spec"]}}
    for key, value in patch["spec"].items():
        merged["spec"][key] = {**merged["spec"].get(key, {}), **value} if isinstance(value, dict) else value
    assert backend.is_suspended(merged)
    assert backend.state(merged, 3).phase == api.SUSPENDED


def test_job_states() -> None:
    job = backends.JOB.build_workload(spec(), TARGET)
    assert backends.JOB.state(job, 3).phase == api.PENDING
    job["status"] = {"active": 3, "ready": 2, "startTime": "2026-01-02T03:04:05+00:00"}
    st = backends.JOB.state(job, 3)
    assert (st.phase, st.message, st.start_time) == (api.RUNNING, "2/3 pods ready, 3 active",
                                                      "2026-01-02T03:04:05Z")
    job["status"]["conditions"] = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                    "lastTransitionTime": "2026-01-02T04:00:00Z"}]
    st = backends.JOB.state(job, 3)
    assert (st.phase, st.reason, st.completion_time) == (api.FAILED, "BackoffLimitExceeded",
                                                         "2026-01-02T04:00:00Z")


def test_pytorchjob_states() -> None:
    pj = backends.PYTORCHJOB.build_workload(spec(replicas=2), TARGET)
    assert backends.PYTORCHJOB.state(pj, 2).phase == api.PENDING
    pj["status"] = {"conditions": [{"type": "Created", "status": "True"},
                                   {"type": "Running", "status": "True"}],
                    "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 1}}}
    st = backends.PYTORCHJOB.state(pj, 2)
    assert st.phase == api.RUNNING and st.active == 2
    pj["status"]["conditions"].append({"type": "Succeeded", "status": "True"})
    assert backends.PYTORCHJOB.state(pj, 2).phase == api.SUCCEEDED


def test_pods_and_their_ranks() -> None:
    assert backends.JOB.pods_selector("pets-r1") == "job-name=pets-r1"
    labels = {"job-name": "pets-r1", "batch.kubernetes.io/job-completion-index": "2"}
    assert backends.JOB.rank_of({"metadata": {"labels": labels}}) == 2
    assert backends.PYTORCHJOB.pods_selector("pets") == "training.kubeflow.org/job-name=pets"
    labels = {"training.kubeflow.org/replica-type": "master", "training.kubeflow.org/replica-index": "0"}
    assert backends.PYTORCHJOB.rank_of({"metadata": {"labels": labels}}) == 0
    labels = {"training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "1"}
    assert backends.PYTORCHJOB.rank_of({"metadata": {"labels": labels}}) == 2  # Worker i is rank i + 1
    assert backends.JOB.rank_of({"metadata": {"labels": {}}}) is None
