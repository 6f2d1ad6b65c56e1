"""(observed Job/PyTorchJob, progress, summary) -> status, conditions, events and actions."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from operator_specs import condition, round_of, training  # tests/unit/operator/operator_specs.py
from pets_operator import (
    api,
    backends,
    builders,
    children,
    plan_types,
    pods,
    refusals,
    restarts,
)
from pets_operator import plan as planner
from pets_operator.plan_types import Round
from pets_operator.progress import parse_progress
from pets_operator.status_types import Status

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
TARGET = builders.Target("pets", "ns")


def job(conditions: list[dict[str, Any]] | None = None, attempt: int = 0, suspend: bool = False,
        **st: Any) -> dict[str, Any]:
    j = children.build_job(api.resolve_spec({}), builders.Target("pets", "ns", attempt))
    j["spec"]["suspend"] = suspend
    j["status"] = {"conditions": [{"status": "True", **c} for c in conditions or []], **st}
    return j


def run(b: dict[str, Any], workload: dict[str, Any] | None, *, backend: str = "job", now: datetime = NOW,
        built_from: dict[str, Any] | None = None, **observed: Any) -> plan_types.Plan:
    """Plan with `workload` as the current one, built from the body's spec (or from `built_from`)."""
    spec = api.resolve_spec(b["spec"])
    chosen = backends.get(backend)
    st = b.get("status") or {}
    target = builders.Target("pets", "ns", int(st.get("attempt", st.get("restarts") or 0)))
    if workload is not None:
        workload["metadata"]["annotations"][api.ANNOTATION_SPEC_DIGEST] = builders.spec_digest(
            api.resolve_spec(built_from) if built_from is not None else spec)
    obs = plan_types.Observed(backend=chosen, workload=workload, service=chosen.build_service(spec, target),
                          **observed)
    return planner.plan(Round.of(b, spec, obs, target, now))


def unplannable(b: dict[str, Any], now: datetime = NOW, **error: str) -> plan_types.Plan:
    """The plan of a training whose spec (spec_error) or backend (backend_error) cannot run."""
    return planner.plan(Round.of(b, None, plan_types.Observed(backends.JOB, None), TARGET, now, **error))


def resume_point(spec: Any, st: Status) -> str:
    return restarts.resume_point(round_of(spec=spec), plan_types.Plan(status=st))


def test_new_training_creates_service_and_job_once() -> None:
    spec = api.resolve_spec({"replicas": 2, "backend": "job"})
    observed = plan_types.Observed(backend=backends.JOB, workload=None, backend_reason="spec.backend is job")
    p = planner.plan(Round.of(training(replicas=2, backend="job"), spec, observed, TARGET, NOW))
    assert [m["kind"] for m in p.create] == ["Service", "NetworkPolicy", "PersistentVolumeClaim", "Job"]
    assert p.status.phase == api.PENDING
    assert p.status.observed_generation == 3
    assert p.status.children == {"service": "pets", "job": "pets", "outputClaim": "pets-output",
                                    "networkPolicy": "pets"}
    assert p.status.workload_active is True and p.status.attempt == 0
    assert p.status.backend_reason == "spec.backend is job"
    assert condition(p, "Progressing")["status"] == "True"
    # An explicit backend is no choice: no BackendSelected Event (`auto` gets one: the test below).
    assert [(e.reason, e.message) for e in p.events] == [("Created", "created Job pets")]
    # Once both exist, nothing is created again (idempotent).
    p2 = run(training(p.status, replicas=2), job())
    assert p2.create == [] and p2.delete == []


def test_a_managed_output_claim_is_created_before_the_first_workload_only() -> None:
    spec = api.resolve_spec({"replicas": 2, "backend": "job", "output": {"managedClaim": {}}})
    observed = plan_types.Observed(backend=backends.JOB, workload=None)
    stored = training(replicas=2, backend="job", output={"managedClaim": {}})
    p = planner.plan(Round.of(stored, spec, observed, TARGET, NOW))
    assert [m["kind"] for m in p.create] == ["Service", "NetworkPolicy", "PersistentVolumeClaim", "Job"]
    assert p.create[2]["metadata"]["name"] == "pets-output"
    p2 = run(training(p.status, replicas=2, output={"managedClaim": {}}), job())
    assert p2.create == []
    assert "OutputClaimRetained" not in [e.reason for e in p.events]  # Delete: it goes with the training


def test_a_url_datasets_cache_claim_is_created_before_the_workload() -> None:
    dataset = {"url": "https://example.com/pets.tar.gz"}
    spec = api.resolve_spec({"replicas": 2, "backend": "job", "dataset": dataset})
    observed = plan_types.Observed(backend=backends.JOB, workload=None)
    p = planner.plan(Round.of(training(replicas=2, backend="job", dataset=dataset), spec, observed, TARGET,
                             NOW))
    kinds = ["Service", "NetworkPolicy", "PersistentVolumeClaim", "PersistentVolumeClaim", "Job"]
    assert [m["kind"] for m in p.create] == kinds
    assert p.create[3]["metadata"]["name"] == builders.dataset_cache_name(spec)
    assert not children.owned(p.create[3])


def test_a_retained_claim_is_named_in_an_event_once() -> None:
    output = {"managedClaim": {"retentionPolicy": "Retain"}}
    spec = api.resolve_spec({"output": output})
    observed = plan_types.Observed(backend=backends.JOB, workload=None)
    p = planner.plan(Round.of(training(output=output), spec, observed, TARGET, NOW))
    (retained,) = [e for e in p.events if e.reason == "OutputClaimRetained"]
    assert "pets-output has retentionPolicy Retain" in retained.message
    assert "kubectl delete pvc -n ns pets-output" in retained.message
    restart = planner.plan(Round.of(training({"attempt": 1, "restarts": 1}, output=output), spec, observed,
                          builders.Target("pets", "ns", 1), NOW))
    assert "OutputClaimRetained" not in [e.reason for e in restart.events]


def test_auto_says_what_it_chose_once() -> None:
    spec = api.resolve_spec({"backend": "auto"})
    why = "spec.backend is auto: --auto-backend is job"
    observed = plan_types.Observed(backend=backends.JOB, workload=None, backend_reason=why)
    p = planner.plan(Round.of(training(backend="auto"), spec, observed, TARGET, NOW))
    assert [(e.reason, e.message) for e in p.events] == [
        ("BackendSelected", f"running as a Job: {why}"), ("Created", "created Job pets")]


def test_running_with_progress_mirrored() -> None:
    scrape = parse_progress(
        "# TYPE pets_epoch gauge\npets_epoch 2\n# TYPE pets_total_epochs gauge\npets_total_epochs 5\n"
        "# TYPE pets_eval_accuracy gauge\npets_eval_accuracy 0.875\n"
        "# TYPE pets_train_loss gauge\npets_train_loss 0.5\n"
        "# TYPE pets_eta_seconds gauge\npets_eta_seconds 30\n"
        "# TYPE pets_images_per_second gauge\npets_images_per_second 123.5\n")
    p = run(training({"phase": api.PENDING}), job(active=1, ready=1, startTime="2026-01-02T03:00:00Z"),
            progress=scrape)
    st = p.status.to_dict()
    assert st["phase"] == api.RUNNING and st["activeReplicas"] == 1 and st["readyReplicas"] == 1
    assert st["epoch"] == 2 and st["totalEpochs"] == 5 and st["progress"] == "2/5"
    assert st["evalAccuracy"] == 0.875 and st["trainLoss"] == 0.5 and st["etaSeconds"] == 30.0
    assert st["imagesPerSecond"] == 123.5
    assert st["startTime"] == "2026-01-02T03:00:00Z"
    assert condition(p, "Ready")["status"] == "True"
    assert [e.reason for e in p.events] == [api.RUNNING]


def test_succeeded_takes_the_summary() -> None:
    summary = pods.parse_summary(json.dumps({"status": "succeeded", "epochs": 5, "final_accuracy": 0.94,
                                               "final_train_loss": 0.2, "images_per_second": 120.0}))
    p = run(training({"phase": api.RUNNING}),
            job([{"type": "Complete"}], succeeded=2, completionTime="2026-01-02T03:04:00Z"), summary=summary)
    st = p.status.to_dict()
    assert st["phase"] == api.SUCCEEDED and st["evalAccuracy"] == 0.94 and st["progress"] == "5/5"
    assert st["completionTime"] == "2026-01-02T03:04:00Z" and st["summary"]["status"] == "succeeded"
    assert condition(p, "Succeeded")["status"] == "True" and condition(p, "Progressing")["status"] == "False"
    assert "0.9400" in st["message"]


def test_failure_restarts_the_gang_then_fails() -> None:
    failed = job([{"type": "Failed", "reason": "BackoffLimitExceeded", "message": "pod failed"}])
    made = {"phase": api.RUNNING, "children": {"job": "pets", "service": "pets", "networkPolicy": "pets"}}
    p = run(training(made, maxRestarts=2), failed,
            summary={"status": "failed", "error": "CUDA out of memory"})
    assert p.status.phase == api.RESTARTING and p.status.restarts == 1
    assert p.delete == [{"apiVersion": "batch/v1", "kind": "Job", "name": "pets", "namespace": "ns"}]
    assert p.create == []
    assert "CUDA out of memory" in p.status.message
    assert [e.type for e in p.events] == ["Warning"]
    assert p.status.children["job"] == "pets"  # switches to pets-r1 once the status is stored

    # Next round: old Job still going away -> wait, do not create yet.
    wait = run(training(p.status, maxRestarts=2), None, stale=[failed])
    assert wait.create == [] and wait.status.phase == api.RESTARTING

    # Old Job gone -> attempt 1 is created with its own name.
    again = run(training(p.status, maxRestarts=2), None)
    assert [m["metadata"]["name"] for m in again.create] == ["pets-output", "pets-r1"]
    assert again.status.children["job"] == "pets-r1"

    # Last allowed restart used up -> Failed, nothing deleted, nothing created.
    final = run(training({"phase": api.RUNNING, "restarts": 2}, maxRestarts=2),
                job([{"type": "Failed", "reason": "BackoffLimitExceeded"}], attempt=2))
    assert final.status.phase == api.FAILED and final.delete == [] and final.create == []
    assert condition(final, "Failed")["reason"] == "MaxRestartsExceeded"
    assert any(e.type == "Warning" and e.reason == api.FAILED for e in final.events)


def pending_pod(index: int, attempt: int) -> dict[str, Any]:
    job_name = "pets" if attempt == 0 else f"pets-r{attempt}"
    labels = {"job-name": job_name, "batch.kubernetes.io/job-completion-index": str(index)}
    return {"metadata": {"name": f"{job_name}-{index}-x", "creationTimestamp": "2026-01-02T03:00:00Z",
                         "labels": labels},
            "spec": {"nodeName": "node-a", "containers": [{"name": "trainer", "image": "img:1"}]},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}],
                       "containerStatuses": [{"name": "trainer", "image": "img:1",
                                              "state": {"waiting": {"reason": "ContainerCreating"}}}]}}


def test_the_phase_says_restarting_from_the_gang_restart_until_the_new_gang_runs() -> None:
    """Every round between a gang restart and the new attempt's pods running says Restarting (never
    Pending: that reads as a training that never started), then Running."""
    failed = job([{"type": "Failed", "reason": "BackoffLimitExceeded", "message": "pod failed"}])
    p = run(training({"phase": api.RUNNING}, replicas=2, maxRestarts=2), failed)
    rounds = [(p.status.phase, condition(p, "Progressing")["reason"])]
    p = run(training(p.status, replicas=2, maxRestarts=2), None, stale=[failed])  # the old Job still goes
    rounds.append((p.status.phase, condition(p, "Progressing")["reason"]))
    p = run(training(p.status, replicas=2, maxRestarts=2), None)  # gone: attempt 1 is created
    assert [m["metadata"]["name"] for m in p.create] == ["pets-output", "pets-r1"]  # the claim first
    rounds.append((p.status.phase, condition(p, "Progressing")["reason"]))
    p = run(training(p.status, replicas=2, maxRestarts=2), job(attempt=1))  # created, no pod yet
    rounds.append((p.status.phase, condition(p, "Progressing")["reason"]))
    p = run(training(p.status, replicas=2, maxRestarts=2), job(attempt=1, active=2),
            pods=[pending_pod(0, 1), pending_pod(1, 1)])  # its pods wait for their containers
    rounds.append((p.status.phase, condition(p, "Progressing")["reason"]))
    p = run(training(p.status, replicas=2, maxRestarts=2), job(attempt=1, active=2, ready=2))
    rounds.append((p.status.phase, condition(p, "Progressing")["reason"]))
    assert rounds == [
        (api.RESTARTING, "GangRestart"),
        (api.RESTARTING, "WaitingForOldAttempt"),
        (api.RESTARTING, "Created"),
        (api.RESTARTING, "WaitingForPods"),
        (api.RESTARTING, "ContainerCreating"),
        (api.RUNNING, "PodsRunning"),
    ]
    assert p.status.restarts == 1 and p.status.attempt == 1


def test_an_edit_during_a_restart_rebuilds_and_still_says_restarting() -> None:
    p = run(training({"phase": api.RESTARTING, "restarts": 1, "attempt": 1}, replicas=2, epochs=9),
            job(attempt=1), built_from={"replicas": 2})
    assert condition(p, "Progressing")["reason"] == "Rebuilding"
    assert p.status.phase == api.RESTARTING


def test_finished_is_terminal() -> None:
    p = run(training({"phase": api.SUCCEEDED, "completionTime": "2026-01-02T03:00:00Z"}), None)
    assert p.create == [] and p.status.phase == api.SUCCEEDED


def test_a_field_the_planner_does_not_model_is_kept_as_it_was() -> None:
    """A newer operator's field (a downgrade): every round writes it back as read, never removes it."""
    stored = {"phase": api.RUNNING, "attempt": 0, "fromANewerOperator": {"kept": [1, 2]}}
    for p in (run(training(stored), job(active=2)), unplannable(training(stored), spec_error="bad")):
        assert p.status.to_dict()["fromANewerOperator"] == {"kept": [1, 2]}
        assert "fromANewerOperator" not in plan_types.merge_patch(stored, p.status.to_dict())


def test_suspend_and_resume_go_through_the_job() -> None:
    p = run(training({"phase": api.RUNNING}, suspend=True), job(active=2))
    assert p.suspend is True and p.status.phase == api.SUSPENDED
    assert condition(p, "Suspended")["status"] == "True"
    p2 = run(training(p.status, suspend=True), job([{"type": "Suspended"}], suspend=True))
    assert p2.suspend is None and p2.status.phase == api.SUSPENDED
    p3 = run(training(p2.status, suspend=False), job([{"type": "Suspended"}], suspend=True))
    assert p3.suspend is False and p3.status.phase == api.PENDING
    assert [e.reason for e in p3.events] == ["Resumed"]
    # A training created suspended creates a suspended Job.
    p4 = run(training(suspend=True), None)
    assert p4.create[-1]["spec"]["suspend"] is True and p4.status.phase == api.SUSPENDED


def test_condition_transition_time_moves_only_on_change() -> None:
    p = run(training({"phase": api.PENDING}), job(active=1))
    first = condition(p, "Ready")["lastTransitionTime"]
    later = NOW + timedelta(minutes=5)
    p2 = run(training(p.status), job(active=1), now=later)
    assert condition(p2, "Ready")["lastTransitionTime"] == first
    p3 = run(training(p2.status), job([{"type": "Complete"}]), now=later)
    assert condition(p3, "Ready")["lastTransitionTime"] == "2026-01-02T03:09:05Z"


def test_ttl_after_finished() -> None:
    done = {"phase": api.SUCCEEDED, "completionTime": "2026-01-02T03:00:00Z"}
    early = run(training(done, ttlSecondsAfterFinished=600), None)
    assert not early.delete_self and early.requeue_after == pytest.approx(600 - 245)
    late = run(training(done, ttlSecondsAfterFinished=60), None)
    assert late.delete_self
    assert not run(training(done), None).delete_self


def test_summary_parsing_is_lenient() -> None:
    assert pods.parse_summary(None) is None
    assert pods.parse_summary("Traceback: boom") is None
    assert pods.parse_summary("[1, 2]") is None
    assert pods.parse_summary('{"status": "failed", "error": "x"}') == {"status": "failed", "error": "x"}


def test_progress_parser_ignores_other_metrics_and_nan() -> None:
    text = ("# TYPE pets_epoch gauge\npets_epoch 3\n# TYPE pets_eta_seconds gauge\npets_eta_seconds NaN\n"
            "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n")
    assert parse_progress(text) == {"pets_epoch": 3.0}


def test_child_timestamps_in_either_rfc3339_form() -> None:
    """The client library serialises times as '+00:00'; the status always gets the server's 'Z' form."""
    j = job([{"type": "Complete"}], startTime="2026-01-02T03:00:00+00:00",
            completionTime="2026-01-02T03:04:00+00:00")
    p = run(training({"phase": api.RUNNING}, ttlSecondsAfterFinished=600), j)
    assert p.status.start_time == "2026-01-02T03:00:00Z"
    assert p.status.completion_time == "2026-01-02T03:04:00Z"
    assert p.requeue_after == pytest.approx(600 - 5)


def test_invalid_spec_plan_fails_with_one_event() -> None:
    p = unplannable(training({"phase": api.PENDING}), spec_error="spec.dataset: bad")
    assert p.status.phase == api.FAILED and p.status.message == "spec.dataset: bad"
    assert condition(p, "Failed") == {"type": "Failed", "status": "True", "reason": "InvalidSpec",
                                 "message": "spec.dataset: bad", "lastTransitionTime": "2026-01-02T03:04:05Z",
                                 "observedGeneration": 3}
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "InvalidSpec")]
    assert p.create == [] and p.delete == []
    # The same reason again (an operator restart) writes nothing new and emits no second Event.
    again = unplannable(training(p.status), NOW + timedelta(seconds=30), spec_error="spec.dataset: bad")
    assert again.status.to_dict() == p.status.to_dict() and again.events == []


def test_backend_unavailable_plan_waits_pending() -> None:
    p = unplannable(training(), backend_error="spec.backend is 'pytorchjob' but ...")
    assert p.status.phase == api.PENDING
    assert condition(p, "Progressing")["reason"] == "BackendUnavailable"
    assert [e.reason for e in p.events] == ["BackendUnavailable"]
    assert unplannable(training(p.status), backend_error="spec.backend is 'pytorchjob' but ...").events == []


def test_target_attempt_names_the_workload_after_a_restart() -> None:
    p = run(training({"phase": api.RESTARTING, "restarts": 2, "children": {"networkPolicy": "pets"}}), None)
    assert [m["metadata"]["name"] for m in p.create] == ["pets-output", "pets-r2"]
    assert p.status.children == {"service": "pets", "job": "pets-r2", "outputClaim": "pets-output",
                                    "networkPolicy": "pets"}


@pytest.mark.parametrize(("output", "says"), [
    ({"emptyDir": {}}, "starting from epoch 0 (the output is an emptyDir, which goes with the pods)"),
    ({"managedClaim": {}}, "resuming from the checkpoint of epoch 2"),
    ({"persistentVolumeClaim": {"claimName": "out"}}, "resuming from the checkpoint of epoch 2"),
])
def test_a_restart_says_where_it_resumes_for_each_output(output: dict[str, Any], says: str) -> None:
    spec = api.resolve_spec({"output": output})
    assert resume_point(spec, Status(last_checkpoint={"epoch": 2})) == says
    # With the run's steps known (the trainer's gauges), the step too: epochs are of equal length.
    with_steps = Status(last_checkpoint={"epoch": 2}, total_epochs=5, steps_total=60)
    assert resume_point(spec, with_steps) == says + (", step 24" if "epoch 2" in says else "")
    # A trainer that serves its newest checkpoint's step (a step checkpoint, mid-epoch): that step, read
    # up to a progress interval ago, so "or later".
    step_checkpoint = Status(last_checkpoint={"epoch": 2, "step": 31})
    if "epoch 2" in says:
        assert resume_point(spec, step_checkpoint) == \
            "resuming from the newest checkpoint, at step 31 or later"


@pytest.mark.parametrize(("output", "durable", "reason", "words"), [
    ({"emptyDir": {}}, "False", "EmptyDir", "set spec.output.managedClaim: {}"),
    ({"managedClaim": {"retentionPolicy": "Retain"}}, "True", "ManagedClaim",
     "on the claim pets-output, which the operator made (retentionPolicy Retain)"),
    ({"persistentVolumeClaim": {"claimName": "out"}}, "True", "Claim", "on the claim out"),
])
def test_output_durable_says_whether_the_work_outlives_the_pods(output: dict[str, Any], durable: str,
                                                                reason: str, words: str) -> None:
    spec = api.resolve_spec({"output": output})
    observed = plan_types.Observed(backend=backends.JOB, workload=None)
    p = planner.plan(Round.of(training(output=output), spec, observed, TARGET, NOW))
    c = condition(p, "OutputDurable")
    assert (c["status"], c["reason"]) == (durable, reason) and words in c["message"], c
    # Stable: the next round changes nothing about it (no status write for it).
    again = planner.plan(Round.of(training(p.status, output=output), spec, observed, TARGET,
                                 NOW + timedelta(minutes=1)))
    assert condition(again, "OutputDurable") == c


@pytest.mark.parametrize(("chosen", "why", "durable", "reason", "words"), [
    (api.default_output(), children.OPERATOR_DEFAULT, "True", "ManagedClaim",
     "spec.output is unset, so checkpoints and results are on the claim pets-output"),
    ({"emptyDir": {}}, children.NO_DEFAULT_STORAGE_CLASS, "False", "NoDefaultStorageClass",
     "the cluster has no default StorageClass, so the operator made no claim and fell back to an emptyDir"),
    ({"emptyDir": {}}, children.OPERATOR_DEFAULT, "False", "EmptyDir",
     "the operator's default output is an emptyDir (the chart's defaultOutput.managedClaim.enabled=false)"),
])
def test_an_unset_output_is_the_operators_choice_kept_in_status(
        chosen: dict[str, Any], why: str, durable: str, reason: str, words: str) -> None:
    """reconcile._resolve_output chose `chosen` for a spec without output: status.output keeps it (the next
    round resolves from there), and OutputDurable says what it means."""
    spec = dataclasses.replace(api.resolve_spec({}), output=chosen)
    observed = plan_types.Observed(backend=backends.JOB, workload=None, output_reason=why)
    p = planner.plan(Round.of(training(), spec, observed, TARGET, NOW))
    assert (p.status.output, p.status.output_reason) == (chosen, why)
    c = condition(p, "OutputDurable")
    assert (c["status"], c["reason"]) == (durable, reason) and words in c["message"], c
    claims = [m for m in p.create if m["kind"] == "PersistentVolumeClaim"]
    assert len(claims) == (1 if "managedClaim" in chosen else 0)
    assert ("outputClaim" in p.status.children) == bool(claims)
    if "emptyDir" in chosen:
        assert "epoch 0" in c["message"] and "set spec.output." in c["message"]  # what it costs, the fix


def test_an_output_the_spec_names_clears_an_old_choice() -> None:
    spec = api.resolve_spec({"output": {"emptyDir": {}}})
    old = {"output": {"managedClaim": {}}, "outputReason": children.OPERATOR_DEFAULT}
    observed = plan_types.Observed(backend=backends.JOB, workload=None)
    p = planner.plan(Round.of(training(old, output={"emptyDir": {}}), spec, observed, TARGET, NOW))
    assert p.status.output is None and p.status.output_reason is None


def test_a_pending_claim_makes_output_durable_unknown_until_it_binds() -> None:
    claim = children.build_output_claim(api.resolve_spec({}), TARGET)
    assert claim is not None
    claim["spec"]["storageClassName"] = "slow"
    pending = claim | {"status": {"phase": "Pending"}}
    running = {"phase": api.PENDING, "attempt": 0}
    p = run(training(running), job(active=2), output_claim=pending,
            output_reason=children.OPERATOR_DEFAULT)
    c = condition(p, "OutputDurable")
    assert (c["status"], c["reason"]) == ("Unknown", "ClaimPending")
    assert "pets-output (StorageClass slow, ReadWriteOnce) is Pending" in c["message"]
    assert "kubectl describe pvc pets-output" in c["message"]
    assert "ReadWriteMany" not in c["message"]
    several = pending | {"spec": {**pending["spec"], "accessModes": ["ReadWriteMany"]}}
    rwx = condition(run(training(running), job(active=2), output_claim=several), "OutputDurable")
    assert "a class without ReadWriteMany never binds it" in rwx["message"], rwx
    bound = run(training(p.status), job(active=2, ready=2), output_reason=children.OPERATOR_DEFAULT)
    assert (condition(bound, "OutputDurable")["status"], condition(bound, "OutputDurable")["reason"]) == \
        ("True", "ManagedClaim")


def test_a_claim_left_by_a_deleted_training_of_the_same_name_is_waited_for() -> None:
    """Deleted and applied again at once: the old training's claim is still there, on its way out (the
    garbage collector's). Pods made now would mount it and wait for ever: the round waits instead."""
    claim = children.build_output_claim(api.resolve_spec({}), TARGET)
    assert claim is not None
    old_owner = claim | {"metadata": {**claim["metadata"], "ownerReferences": [{"uid": "old-uid"}]}}
    deleting = claim | {"metadata": {**claim["metadata"], "deletionTimestamp": "2026-01-02T03:04:00Z"}}
    for going in (old_owner, deleting):
        p = run(training(), None, output_claim=going)
        assert p.create == [] and p.status.phase == api.PENDING
        assert condition(p, "Progressing")["reason"] == "WaitingForOldClaim", p.status.to_dict()
        assert p.requeue_after == refusals.CHILD_RETRY_MIN_SECONDS
    # Ours (a round that made it, then crashed), or kept work (Retain: no owner): used as it is.
    ours = claim | {"metadata": {**claim["metadata"], "ownerReferences": [{"uid": "u1"}]}}
    for usable in (ours, claim):
        assert [m["kind"] for m in run(training(), None, output_claim=usable).create][-1] == "Job"


def test_the_status_patch_removes_what_the_plan_removed_and_sends_only_what_changed() -> None:
    old = {"phase": api.PENDING, "pendingSince": "2026-01-02T03:04:05Z", "restarts": 0,
           "output": {"emptyDir": {}},
           "children": {"job": "pets", "service": "pets", "networkPolicy": "pets"},
           "conditions": [{"type": "Ready", "status": "False"}]}
    new = {"phase": api.RUNNING, "restarts": 0, "children": {"job": "pets", "service": "pets"},
           "conditions": [{"type": "Ready", "status": "True"}], "epoch": 1}
    assert plan_types.merge_patch(old, new) == {
        "phase": api.RUNNING, "pendingSince": None, "output": None, "children": {"networkPolicy": None},
        "conditions": [{"type": "Ready", "status": "True"}], "epoch": 1}
    assert plan_types.merge_patch(new, new) == {}
    assert plan_types.merge_patch({}, new) == new
    # a dict where there was none is sent whole; one that became a scalar replaces it
    assert plan_types.merge_patch({"queue": "q"}, {"queue": {"name": "q"}}) == {"queue": {"name": "q"}}
    assert plan_types.merge_patch({"queue": {"name": "q"}}, {"queue": "q"}) == {"queue": "q"}


def test_a_training_that_leaves_pending_loses_pending_since_in_the_stored_status() -> None:
    """The plan pops pendingSince once pods run; the patch it is written with must null it."""
    pending = {"phase": api.PENDING, "pendingSince": "2026-01-02T03:04:05Z", "attempt": 0,
               "children": {"job": "pets", "service": "pets"}}
    p = run(training(pending, replicas=2), job(active=2, ready=2))
    assert p.status.pending_since is None
    assert plan_types.merge_patch(pending, p.status.to_dict())["pendingSince"] is None
