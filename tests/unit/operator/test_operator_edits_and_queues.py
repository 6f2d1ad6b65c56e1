"""No edit is lost (a workload built from an older spec is rebuilt), and a queued training leaves its
workload's suspend to Kueue, mirroring Kueue's reasons into status."""

from __future__ import annotations

import json
from typing import Any

import pytest
from operator_specs import condition, training  # tests/unit/operator/operator_specs.py
from pets_operator import api, backends, builders, plan_types
from pets_operator import plan as planner
from pets_operator.plan_types import Round
from test_operator_status import NOW, job, run

from pets_contract import exits

pytestmark = pytest.mark.unit

QUEUE = {api.KUEUE_QUEUE_LABEL: "team-a"}


# ------------------------------------------------------------------------------------ no edit is lost

def test_spec_digest_ignores_the_fields_only_the_operator_reads() -> None:
    base = api.resolve_spec({"replicas": 2})
    same = api.resolve_spec({"replicas": 2, "maxRestarts": 7, "suspend": True, "ttlSecondsAfterFinished": 5,
                             "scheduling": {"pendingTimeoutSeconds": 60}})
    assert builders.spec_digest(base) == builders.spec_digest(same)
    for edit in ({"replicas": 3}, {"epochs": 9}, {"resources": {"cpu": "2"}}, {"image": "other:1"}):
        assert builders.spec_digest(api.resolve_spec({"replicas": 2, **edit})) != builders.spec_digest(base)


def test_checkpoints_carry_over_only_where_their_shape_allows() -> None:
    base = builders.checkpoint_dir(api.resolve_spec({}))
    assert base.startswith(f"{api.OUTPUT_DIR}/checkpoints/")
    # Same shape: a restart (or an edit of the image, say) resumes from the same directory ...
    assert builders.checkpoint_dir(api.resolve_spec({"image": "other:1", "mixedPrecision": "no"})) == base
    # ... and so does a resize: a step checkpoint holds the global position, at any world size ...
    assert builders.checkpoint_dir(api.resolve_spec({"replicas": 3})) == base
    # ... a new shape (the LR schedule's length, the processes per pod) starts afresh beside it.
    for edit in ({"epochs": 9}, {"processesPerReplica": 2}, {"batchSize": 8}, {"seed": 1}):
        assert builders.checkpoint_dir(api.resolve_spec(edit)) != base


def test_an_edit_while_suspended_rebuilds_the_workload_from_the_new_spec() -> None:
    old_spec = {"replicas": 2, "epochs": 5, "suspend": True}
    new_spec = {"replicas": 3, "epochs": 9, "suspend": False}  # edited, then resumed in one apply
    suspended = job(suspend=True, conditions=[{"type": "Suspended"}])
    made = {"phase": api.SUSPENDED, "backend": "job", "children": {"job": "pets", "networkPolicy": "pets"}}
    p = run(training(made, **new_spec), suspended, built_from=old_spec)
    # The old workload goes, as a new attempt that is not a restart; nothing is unsuspended.
    assert p.delete == [{"apiVersion": "batch/v1", "kind": "Job", "name": "pets", "namespace": "ns"}]
    assert p.suspend is None
    assert p.status.attempt == 1 and p.status.restarts == 0
    assert p.status.children["job"] == "pets-r1"
    assert p.status.phase == api.PENDING and "rebuilding it from the new spec" in p.status.message
    assert p.status.workload_active is False
    assert [e.reason for e in p.events] == ["Resized", "Rebuilding"]  # 2 -> 3, on resume
    assert p.status.resize is None  # suspended: nothing drains
    # The next round waits for the old one to go, then builds attempt 1 from the spec that is there now.
    stale = job(suspend=True)
    stale["metadata"]["deletionTimestamp"] = "2026-01-02T03:04:00Z"
    waiting = planner.plan(Round.of(training(p.status, **new_spec), api.resolve_spec(new_spec),
                          plan_types.Observed(backend=backends.JOB, workload=None, stale=[stale], service={}),
                          builders.Target("pets", "ns", 1), NOW))
    assert waiting.create == [] and waiting.status.phase == api.PENDING
    created = planner.plan(Round.of(training(waiting.status, **new_spec), api.resolve_spec(new_spec),
                          plan_types.Observed(backend=backends.JOB, workload=None, service={}),
                          builders.Target("pets", "ns", 1), NOW))
    (_, new_job) = created.create  # the output claim, then the Job
    assert new_job["metadata"]["name"] == "pets-r1"
    assert new_job["spec"]["parallelism"] == 3 and new_job["spec"]["suspend"] is False
    assert "9" == new_job["spec"]["template"]["spec"]["containers"][0]["args"][1]  # --epochs 9
    assert created.status.workload_active is True and created.status.total_epochs == 9


def test_a_workload_built_from_the_current_spec_is_kept_and_resumed() -> None:
    p = run(training({"phase": api.SUSPENDED}, replicas=2),
            job(suspend=True, conditions=[{"type": "Suspended"}]))
    assert p.delete == [] and p.suspend is False and p.status.attempt == 0


def test_a_workload_from_before_the_digest_is_taken_as_current() -> None:
    old = job(suspend=True)
    spec = api.resolve_spec({"replicas": 2, "suspend": False})
    old["metadata"]["annotations"].pop(api.ANNOTATION_SPEC_DIGEST)
    observed = plan_types.Observed(backend=backends.JOB, workload=old, service={})
    target = builders.Target("pets", "ns")
    p = planner.plan(Round.of(training({"phase": api.SUSPENDED}, replicas=2), spec, observed, target, NOW))
    assert p.delete == [] and p.suspend is False


def test_a_restart_starts_a_new_attempt_and_counts() -> None:
    failed = job(conditions=[{"type": "Failed", "reason": "BackoffLimitExceeded"}])
    p = run(training({"phase": api.RUNNING, "attempt": 2, "restarts": 1}, maxRestarts=3), failed)
    assert p.status.phase == api.RESTARTING
    assert p.status.restarts == 2 and p.status.attempt == 3


# ------------------------------------------------------------------------------------------ Kueue

def kueue_workload(*conditions: dict[str, Any], active: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": "job-pets-1a2b3", "namespace": "ns"}, "spec": {"active": active},
            "status": {"conditions": [{"status": "True", **c} for c in conditions]}}


def run_queued(st: dict[str, Any], workload: dict[str, Any] | None, qw: dict[str, Any] | None = None,
               served: bool = True, **spec: Any) -> plan_types.Plan:
    b = training(st, **spec)
    b["metadata"]["labels"] = dict(QUEUE)
    resolved = api.resolve_spec(b["spec"])
    target = builders.Target("pets", "ns", queue_labels=QUEUE)
    if workload is not None:
        workload["metadata"]["annotations"][api.ANNOTATION_SPEC_DIGEST] = builders.spec_digest(resolved)
    obs = plan_types.Observed(backend=backends.JOB, workload=workload, service={}, queue_workload=qw,
                          queue_served=served)
    return planner.plan(Round.of(b, resolved, obs, target, NOW))


def queued_job(**kw: Any) -> dict[str, Any]:
    j = job(suspend=True, conditions=[{"type": "Suspended"}], **kw)
    j["metadata"]["labels"].update(QUEUE)
    return j


def test_a_queued_training_is_created_suspended_and_shows_queued() -> None:
    p = run_queued({}, None)
    (job_manifest,) = [m for m in p.create if m["kind"] == "Job"]
    assert job_manifest["spec"]["suspend"] is True
    assert job_manifest["metadata"]["labels"][api.KUEUE_QUEUE_LABEL] == "team-a"
    assert p.status.phase == api.QUEUED and p.status.workload_active is False


def test_queued_shows_kueues_own_reason_and_never_touches_suspend() -> None:
    why = "couldn't assign flavors to pod set main: insufficient unused quota for cpu in flavor default"
    qw = kueue_workload({"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": why})
    p = run_queued({"phase": api.PENDING}, queued_job(), qw)
    assert p.suspend is None and p.queue_active is None
    assert p.status.phase == api.QUEUED
    assert p.status.message == f"queued in team-a: {why}"
    assert p.status.queue == {"name": "team-a", "workload": "job-pets-1a2b3", "admitted": False,
                                 "message": why}
    assert [e.reason for e in p.events] == ["Queued"]
    assert not run_queued(p.status.to_dict(), queued_job(), qw).events  # one Event, not one per poll


def test_admitted_runs_as_usual() -> None:
    admitted = job(active=2, ready=2)
    admitted["metadata"]["labels"].update(QUEUE)
    qw = kueue_workload({"type": "QuotaReserved"}, {"type": "Admitted"})
    p = run_queued({"phase": api.QUEUED}, admitted, qw)
    assert p.suspend is None and p.status.queue["admitted"] is True
    assert p.status.workload_active is True


def test_preemption_is_shown_and_is_not_a_failure() -> None:
    qw = kueue_workload({"type": "Evicted", "reason": "Preempted",
                         "message": "Preempted to accommodate a workload (UID: x) due to prioritization"})
    p = run_queued({"phase": api.RUNNING, "restarts": 1}, queued_job(), qw)
    assert p.status.phase == api.PREEMPTED
    assert "Preempted to accommodate" in p.status.message and "not a failure" in p.status.message
    assert p.status.restarts == 1 and p.delete == [] and p.suspend is None
    assert [e.reason for e in p.events] == ["Preempted"]
    assert condition(p, "Failed")["status"] == "False"


def test_the_users_suspend_goes_through_kueues_active_switch() -> None:
    admitted = job(active=2)
    admitted["metadata"]["labels"].update(QUEUE)
    p = run_queued({"phase": api.RUNNING}, admitted, kueue_workload({"type": "Admitted"}), suspend=True)
    assert p.suspend is None  # never the Job's own suspend
    assert (p.queue_active, p.queue_workload) == (False, "job-pets-1a2b3")
    assert p.status.phase == api.SUSPENDED
    assert p.status.workload_active is True  # until Kueue has suspended the Job
    resumed = run_queued({"phase": api.SUSPENDED}, queued_job(), kueue_workload(active=False))
    assert (resumed.queue_active, resumed.suspend) == (True, None)


def test_a_queue_label_without_kueue_says_so() -> None:
    p = run_queued({"phase": api.QUEUED}, queued_job(), None, served=False)
    assert p.status.phase == api.QUEUED
    assert "Kueue is not installed" in p.status.message and p.suspend is None


def test_a_workload_kueue_has_not_picked_up_says_which_integration_to_check() -> None:
    p = run_queued({"phase": api.QUEUED}, queued_job(), None)
    assert p.status.phase == api.QUEUED
    assert "is Kueue's batch/job integration enabled?" in p.status.message


def test_resuming_a_deactivated_workload_is_queued_not_preempted() -> None:
    qw = kueue_workload({"type": "Evicted", "reason": "InactiveWorkload",
                         "message": "The workload is deactivated"})
    p = run_queued({"phase": api.SUSPENDED}, queued_job(), qw)
    assert p.status.phase == api.QUEUED and p.queue_active is None


def test_a_queued_training_that_finished_between_polls_shows_it_was_admitted() -> None:
    done = job(conditions=[{"type": "SuccessCriteriaMet"}, {"type": "Complete"}])
    done["metadata"]["labels"].update(QUEUE)
    p = run_queued({"phase": api.QUEUED, "queue": {"name": "team-a", "admitted": False}}, done,
                   kueue_workload({"type": "Finished"}))
    assert p.status.phase == api.SUCCEEDED and p.status.queue["admitted"] is True


def test_a_deleted_pod_that_is_gone_restarts_without_counting_and_a_visible_crash_still_counts() -> None:
    """make chaos deleted the one pod of a 1-replica training: its trainer stopped on SIGTERM (exit 75),
    but the pod was gone when the operator looked, and the Job said only BackoffLimitExceeded."""
    failed = job(conditions=[{"type": "Failed", "reason": "BackoffLimitExceeded", "message": "too many"}])
    p = run(training({"phase": api.RUNNING, "step": 7}, maxRestarts=0, replicas=1), failed, pods=[])
    assert (p.status.phase, p.status.restarts, p.status.disruptions) == (api.RESTARTING, 1, 1)
    assert p.status.last_failure["cause"] == "Deleted" and p.status.last_failure["rank"] == 0
    assert "pod" not in p.status.last_failure and p.status.last_failure["lastStep"] == 7
    # Rank 1 crashed on its own (its failed pod is kept), and the Job controller deleted rank 0 then:
    # the crash is the cause, and it counts.
    ended = {"terminated": {"exitCode": 1, "finishedAt": "2026-01-02T03:04:00Z"}}
    crashed = {"metadata": {"name": "pets-1-x", "labels": {"batch.kubernetes.io/job-completion-index": "1"}},
               "spec": {"nodeName": "node-a"},
               "status": {"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": ended}]}}
    p = run(training({"phase": api.RUNNING}, maxRestarts=2), failed, pods=[crashed])
    assert (p.status.restarts, p.status.disruptions or 0) == (1, 0)
    assert p.status.last_failure["cause"] == "ExitCode", p.status.last_failure
    # Every rank's pod is there, none failed yet (the pods' watch is behind the Job's): not called deleted.
    running = json.loads(json.dumps(crashed))
    running["status"] = {"phase": "Running"}
    ranks = [running, {**running, "metadata": {**running["metadata"], "labels": {
        "batch.kubernetes.io/job-completion-index": "0"}}}]
    p = run(training({"phase": api.RUNNING}, maxRestarts=2), failed, pods=ranks)
    assert (p.status.restarts, p.status.disruptions or 0) == (1, 0)


def test_a_disruption_the_job_recorded_restarts_without_counting_even_when_the_pod_is_gone() -> None:
    message = ("Pod ns/pets-1-abcde has condition DisruptionTarget matching FailJob rule at index 1")
    failed = job(conditions=[{"type": "FailureTarget", "reason": "PodFailurePolicy", "message": message},
                             {"type": "Failed", "reason": "PodFailurePolicy", "message": message}])
    assert backends.JOB.state(failed, 2).reason == "PodDisrupted"
    p = run(training({"phase": api.RUNNING, "step": 23}, maxRestarts=0), failed, pods=[])
    assert p.status.phase == api.RESTARTING
    assert (p.status.restarts, p.status.disruptions) == (1, 1)
    assert p.status.last_failure["cause"] == "Disrupted"
    assert p.status.last_failure["lastStep"] == 23  # the lost work is counted from there
    # Its peer, which only lost the evicted rank, exited too: that exit is not the cause.
    peer = {"metadata": {"name": "pets-0-x", "labels": {"batch.kubernetes.io/job-completion-index": "0"}},
            "spec": {"nodeName": "node-a"},
            "status": {"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": {"terminated": {
                "exitCode": 1, "finishedAt": "2026-01-02T03:04:00Z"}}}]}}
    p = run(training({"phase": api.RUNNING}, maxRestarts=0), failed, pods=[peer])
    assert (p.status.phase, p.status.restarts, p.status.disruptions) == (api.RESTARTING, 1, 1)
    assert p.status.last_failure["cause"] == "Disrupted", p.status.last_failure
    assert "DisruptionTarget" in p.status.message
    # Its peer stopped with it (exit 75: the evicted rank's SIGTERM stopped all, after a step checkpoint):
    # still the eviction, seen by the CI's e2e (the evicted pod already gone, its peer's 75 left).
    stopped = json.loads(json.dumps(peer))
    stopped["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] = exits.STOPPED
    p = run(training({"phase": api.RUNNING}, maxRestarts=0), failed, pods=[stopped])
    assert (p.status.restarts, p.status.disruptions) == (1, 1)
    assert p.status.last_failure["cause"] == "Disrupted", p.status.last_failure
    # The trainer's permanent exit code is still the first rule: it ends the training at once.
    permanent = ("Container trainer for pod ns/pets-1-x failed with exit code 78 matching FailJob rule "
                 "at index 0")
    ended = job(conditions=[{"type": "Failed", "reason": "PodFailurePolicy", "message": permanent}])
    assert run(training({"phase": api.RUNNING}, maxRestarts=3), ended, pods=[]).status.phase == api.FAILED
