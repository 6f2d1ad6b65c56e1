"""Resizing a training (resize.py): spec.replicas changed while it runs drains the gang and starts the
next attempt at the new size; after a node loss, or a partial admission by Kueue, it goes on smaller where
spec.elastic allows; status.replicas, status.selector, the Resized Event and goodput's resizing time."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from operator_specs import round_of, training  # tests/unit/operator/operator_specs.py
from pets_operator import api, backends, builders, children, goodput, plan_types, resize
from pets_operator import plan as planner
from pets_operator.plan_types import Round
from pets_operator.status_types import Status
from test_operator_status import NOW

pytestmark = pytest.mark.unit


def sized_job(replicas: int, attempt: int = 0, **st: Any) -> dict[str, Any]:
    j = children.build_job(api.resolve_spec({"replicas": replicas}), builders.Target("pets", "ns", attempt))
    j["status"] = st
    return j


def pod(rank: int, scheduled: bool, attempt: int = 0) -> dict[str, Any]:
    conditions = [{"type": "PodScheduled", "status": "True" if scheduled else "False",
                   "lastTransitionTime": "2026-01-02T03:00:00Z",
                   **({} if scheduled else {"reason": "Unschedulable", "message": "0/3 nodes available"})}]
    return {"metadata": {"name": f"pets-r{attempt}-{rank}", "namespace": "ns",
                         "labels": {"batch.kubernetes.io/job-completion-index": str(rank)},
                         "annotations": {"batch.kubernetes.io/job-completion-index": str(rank)}},
            "spec": {"nodeName": "node-a" if scheduled else None},
            "status": {"phase": "Pending", "conditions": conditions}}


def plan(st: dict[str, Any], spec: dict[str, Any], workload: dict[str, Any] | None, *, now: Any = NOW,
         **observed: Any) -> plan_types.Plan:
    resolved = api.resolve_spec(spec)
    target = builders.Target("pets", "ns", int(st.get("attempt") or 0))
    obs = plan_types.Observed(backend=backends.JOB, workload=workload,
                              service=backends.JOB.build_service(resolved, target), **observed)
    return planner.plan(Round.of(training(st, **spec), resolved, obs, target, now))


RUNNING = {"phase": api.RUNNING, "backend": "job", "attempt": 0, "workloadActive": True,
           "children": {"service": "pets", "job": "pets", "networkPolicy": "pets"}}


def test_a_running_training_scaled_down_drains_and_restarts_at_the_new_size() -> None:
    old = sized_job(2, active=2, ready=2)
    old["metadata"]["annotations"][api.ANNOTATION_SPEC_DIGEST] = builders.spec_digest(
        api.resolve_spec({"replicas": 2}))
    p = plan(RUNNING, {"replicas": 1}, old)
    # The old gang goes (its pods stop with the SIGTERM save), as a new attempt, not a restart.
    assert p.delete == [{"apiVersion": "batch/v1", "kind": "Job", "name": "pets", "namespace": "ns"}]
    assert p.status.attempt == 1 and p.status.restarts == 0
    resized = [e for e in p.events if e.reason == "Resized"]
    assert len(resized) == 1 and resized[0].message.startswith("2 -> 1 (Scaled): ")
    assert "SIGTERM" in resized[0].message
    assert p.status.resize == {"from": 2, "to": 1, "asked": 1, "reason": "Scaled",
                                  "since": "2026-01-02T03:04:05Z"}
    assert p.status.replicas == 2  # what runs until it is gone
    # Once it is gone, attempt 1 is built at the new size.
    later = NOW + timedelta(seconds=20)
    made = plan(p.status.to_dict(), {"replicas": 1}, None, now=later)
    (new_job,) = [c for c in made.create if c["kind"] == "Job"]
    assert new_job["metadata"]["name"] == "pets-r1"
    assert new_job["spec"]["parallelism"] == new_job["spec"]["completions"] == 1
    assert made.status.replicas == 1 and made.status.resize["to"] == 1
    # Its pods run: the resize is over, and its drain and restart were booked as resizing, not waiting.
    running = NOW + timedelta(seconds=50)
    new_job["status"] = {"active": 1, "ready": 1}
    done = plan(made.status.to_dict(), {"replicas": 1}, new_job, now=running,
                pods=[{**pod(0, True, 1), "status": {"phase": "Running", "conditions": []}}])
    assert done.status.phase == api.RUNNING and done.status.resize is None
    assert done.status.goodput["resizingSeconds"] == 50.0
    assert done.status.goodput["waitingSeconds"] == 0.0


def test_status_names_the_size_it_runs_at_and_the_pods_selector() -> None:
    p = plan({}, {"replicas": 3}, None)
    assert p.status.replicas == 3
    assert p.status.selector == "training.pets.dev/training=pets,app.kubernetes.io/component=trainer"
    assert resize.selector(round_of()) == p.status.selector


def test_a_workload_built_smaller_than_asked_is_not_taken_for_an_edit() -> None:
    # After a node loss it runs at 1 of 2: its digest is the spec asked for, so no rebuild loop.
    st = {**RUNNING, "resize": {"from": 2, "to": 1, "reason": "NodeLost", "since": "2026-01-02T03:00:00Z"}}
    made = plan({k: v for k, v in st.items() if k != "children"} | {"attempt": 1},
                {"replicas": 2, "elastic": {"minReplicas": 1}}, None)
    (small,) = [c for c in made.create if c["kind"] == "Job"]
    assert small["spec"]["parallelism"] == 1
    assert small["metadata"]["annotations"][builders.ANNOTATION_WORLD_SIZE] == "1"
    assert small["metadata"]["annotations"][api.ANNOTATION_SPEC_DIGEST] == builders.spec_digest(
        api.resolve_spec({"replicas": 2, "elastic": {"minReplicas": 1}}))
    small["status"] = {"active": 1}
    again = plan(made.status.to_dict(), {"replicas": 2, "elastic": {"minReplicas": 1}}, small)
    assert again.delete == [] and again.status.replicas == 1


def _after_node_loss(elastic: dict[str, Any], placed: int, waited: float) -> plan_types.Plan:
    since = NOW - timedelta(seconds=waited)
    st = {"phase": api.RESTARTING, "backend": "job", "attempt": 1, "restarts": 1, "workloadActive": True,
          "pendingSince": since.strftime("%Y-%m-%dT%H:%M:%SZ"),
          "lastFailure": {"cause": "NodeLost", "time": "2026-01-02T02:00:00Z"},
          "children": {"service": "pets", "job": "pets-r1", "networkPolicy": "pets"}}
    spec = {"replicas": 2, "elastic": elastic, "placement": {"nodeLostSeconds": 30}}
    workload = sized_job(2, attempt=1, active=2)
    workload["metadata"]["annotations"][api.ANNOTATION_SPEC_DIGEST] = builders.spec_digest(
        api.resolve_spec(spec))
    return plan(st, spec, workload, pods=[pod(0, True, 1), pod(1, placed > 1, 1)])


def test_after_a_node_loss_a_gang_that_does_not_fit_goes_on_at_the_size_placed() -> None:
    p = _after_node_loss({"minReplicas": 1}, placed=1, waited=31)
    assert p.delete and p.delete[0]["name"] == "pets-r1" and p.status.attempt == 2
    assert p.status.resize["reason"] == "NodeLost" and p.status.resize["to"] == 1
    (event,) = [e for e in p.events if e.reason == "Resized"]
    assert event.message.startswith("2 -> 1 (NodeLost): ") and "nodeLostSeconds=30" in event.message
    assert p.status.restarts == 1  # not a failure
    elastic = {"elastic": {"minReplicas": 1}}
    assert resize.next_size(round_of(p.status, api.resolve_spec({"replicas": 2, **elastic}))) == 1
    # Scaled by its user during the drain: the next attempt is built at what was asked since.
    assert resize.next_size(round_of(p.status, api.resolve_spec({"replicas": 1, **elastic}))) == 1
    grown = api.resolve_spec({"replicas": 4, "elastic": {"minReplicas": 1, "maxReplicas": 4}})
    assert resize.next_size(round_of(p.status, grown)) == 4


@pytest.mark.parametrize(("elastic", "placed", "waited"), [
    ({}, 1, 31),                    # no minReplicas: it never runs smaller than asked
    ({"minReplicas": 2}, 1, 31),    # the bound says no
    ({"minReplicas": 1}, 1, 29),    # within nodeLostSeconds: it waits
    ({"minReplicas": 1}, 2, 31),    # all placed: nothing to do
])
def test_it_waits_where_elastic_or_the_clock_says_so(elastic: dict[str, Any], placed: int,
                                                     waited: float) -> None:
    p = _after_node_loss(elastic, placed, waited)
    assert p.delete == [] and p.status.resize is None
    assert "Resized" not in [e.reason for e in p.events]


def test_kueue_admitting_fewer_pods_rebuilds_the_workload_at_that_size() -> None:
    spec = {"replicas": 2, "elastic": {"minReplicas": 1}}
    workload = sized_job(2, active=1)
    workload["metadata"]["annotations"][api.ANNOTATION_SPEC_DIGEST] = builders.spec_digest(
        api.resolve_spec(spec))
    workload["spec"]["parallelism"] = workload["spec"]["completions"] = 1  # Kueue's partial admission
    p = plan({**RUNNING, "phase": api.PENDING}, spec, workload)
    assert p.status.resize["reason"] == "PartialAdmission" and p.status.resize["to"] == 1
    assert p.delete and p.status.attempt == 1
    # From the size its pods were built for, not the parallelism Kueue lowered.
    (event,) = [e.message for e in p.events if e.reason == "Resized"]
    assert event.startswith("2 -> 1 (PartialAdmission): Kueue admitted 1 of the 2 pods"), event


def test_a_queued_elastic_job_asks_kueue_for_partial_admission() -> None:
    spec = api.resolve_spec({"replicas": 3, "elastic": {"minReplicas": 2}})
    queued = builders.Target("pets", "ns", queue_labels={api.KUEUE_QUEUE_LABEL: "team-a"})
    annotations = children.build_job(spec, queued)["metadata"]["annotations"]
    assert annotations["kueue.x-k8s.io/job-min-parallelism"] == "2"
    assert annotations["kueue.x-k8s.io/job-completions-equal-parallelism"] == "true"
    for plain in (children.build_job(spec, builders.Target("pets", "ns")),
                  children.build_job(api.resolve_spec({"replicas": 3}), queued)):
        assert "kueue.x-k8s.io/job-min-parallelism" not in plain["metadata"]["annotations"]


def test_goodput_lists_each_runs_world_size() -> None:
    st = Status(replicas=2)
    goodput.read_attempt(st, 0, "2026-01-02T03:00:00Z", {})
    st.replicas = 1
    goodput.read_attempt(st, 1, "2026-01-02T03:02:00Z", {})
    assert st.goodput is not None
    assert [(r["attempt"], r["worldSize"]) for r in st.goodput["attempts"]] == [(0, 2), (1, 1)]


@pytest.mark.parametrize(("spec", "ok"), [
    ({"replicas": 2, "elastic": {"minReplicas": 1, "maxReplicas": 4}}, True),
    ({"replicas": 5, "elastic": {"maxReplicas": 4}}, False),
    ({"replicas": 1, "elastic": {"minReplicas": 2}}, False),
    ({"replicas": 2}, True),
])
def test_replicas_stay_within_elastic(spec: dict[str, Any], ok: bool) -> None:
    if ok:
        api.resolve_spec(spec)
    else:
        with pytest.raises(api.SpecError, match=r"spec\.replicas.*spec\.elastic\.minReplicas"):
            api.resolve_spec(spec)


def test_a_training_that_may_grow_gets_a_claim_every_node_can_mount() -> None:
    def modes(spec: dict[str, Any]) -> list[str]:
        return builders.gang_access_modes(api.resolve_spec(spec))

    assert modes({"replicas": 1}) == ["ReadWriteOnce"]  # as before: nothing may grow
    assert modes({"replicas": 1, "elastic": {"maxReplicas": 2}}) == ["ReadWriteMany"]
    assert modes({"replicas": 2, "elastic": {"minReplicas": 1}}) == ["ReadWriteMany"]


def test_the_global_batch_is_fixed_at_the_largest_size_and_passed_to_the_trainer() -> None:
    made = plan({}, {"replicas": 2, "batchSize": 16, "elastic": {"minReplicas": 1, "maxReplicas": 4}}, None)
    assert made.status.global_batch == 16 * 4
    (job,) = [c for c in made.create if c["kind"] == "Job"]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--global-batch-size") + 1] == "64"
    plain = plan({}, {"replicas": 2, "batchSize": 16}, None)
    assert plain.status.global_batch == 32  # what the trainer would take at its first start anyway


def test_a_size_that_cannot_keep_the_global_batch_is_refused_and_the_gang_runs_on() -> None:
    old = sized_job(2, active=2, ready=2)
    old["metadata"]["annotations"][api.ANNOTATION_SPEC_DIGEST] = builders.spec_digest(
        api.resolve_spec({"replicas": 2}))
    st = {**RUNNING, "globalBatch": 128, "checkpointDir": "/output/checkpoints/x",
          "checkpointShape": builders.checkpoint_shape(api.resolve_spec({"replicas": 3}))}
    p = plan(st, {"replicas": 3}, old)
    assert p.delete == [] and p.status.attempt == 0 and p.status.resize_refused == 3
    (refused,) = [e for e in p.events if e.reason == "ResizeRefused"]
    assert refused.type == "Warning"
    assert refused.message.startswith("spec.replicas=3 cannot keep the training's global batch 128")
    assert "sizes that keep it: 1, 2; it runs on at 2" in refused.message
    again = plan(p.status.to_dict(), {"replicas": 3}, old)
    assert "ResizeRefused" not in [e.reason for e in again.events]  # said once


def test_a_node_loss_shrinks_to_the_largest_size_that_keeps_the_global_batch() -> None:
    spec = api.resolve_spec({"replicas": 4, "elastic": {"minReplicas": 1, "maxReplicas": 4}})
    status_ = Status(global_batch=4 * 64)
    assert [resize._fitting(spec, status_, n) for n in (4, 3, 2, 1)] == [4, 2, 2, 1]
    at_least_3 = api.resolve_spec({"replicas": 4, "elastic": {"minReplicas": 3}})
    assert resize._fitting(at_least_3, status_, 3) is None  # 3 cannot keep it, and 2 is below the bound
