"""spec.activeDeadlineSeconds belongs to the training (issue 21): counted from its start without the time
Suspended, Queued or Preempted; when it runs out the training is Failed/DeadlineExceeded with no restart
and no new workload; each attempt's workload gets what is left."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from operator_specs import round_of  # tests/unit/operator/operator_specs.py
from pets_operator import api, backends, builders, children, deadlines, plan_types
from pets_operator import plan as planner
from pets_operator.plan_types import Round
from pets_operator.status_types import Status

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 24, 12, 0, 0, tzinfo=UTC)


def ts(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def body(st: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "pets", "namespace": "ns", "generation": 1, "uid": "u1"},
            "spec": {"activeDeadlineSeconds": 60, **spec}, "status": st}


def job(attempt: int = 0, conditions: list[dict[str, Any]] | None = None, suspend: bool = False,
        **st: Any) -> dict[str, Any]:
    spec = api.resolve_spec({"activeDeadlineSeconds": 60})
    j = children.build_job(spec, builders.Target("pets", "ns", attempt))
    j["spec"]["suspend"] = suspend
    j["status"] = {"conditions": [{"status": "True", **c} for c in conditions or []], **st}
    return j


def plan(b: dict[str, Any], workload: dict[str, Any] | None, **observed: Any) -> plan_types.Plan:
    spec = api.resolve_spec(b["spec"])
    st = b["status"]
    target = builders.Target("pets", "ns", int(st.get("attempt", 0)))
    if workload is not None:
        workload["metadata"]["annotations"][api.ANNOTATION_SPEC_DIGEST] = builders.spec_digest(spec)
    obs = plan_types.Observed(backend=backends.JOB, workload=workload,
                          service=backends.JOB.build_service(spec, target), **observed)
    return planner.plan(Round.of(b, spec, obs, target, NOW))


def left(spec: Any, st: Status, now: datetime) -> float | None:
    return deadlines.deadline_left(round_of(spec=spec, now=now), plan_types.Plan(status=st))


def test_the_time_left_counts_from_the_start_without_pauses() -> None:
    spec = api.resolve_spec({"activeDeadlineSeconds": 60})
    assert left(api.resolve_spec({}), Status(start_time=ts(100)), NOW) is None
    assert left(spec, Status(), NOW) == 60.0  # not started: all of it
    assert left(spec, Status(start_time=ts(20)), NOW) == 40.0
    closed = Status(start_time=ts(50), deadline={"pausedSeconds": 15.0})
    assert left(spec, closed, NOW) == 25.0
    open_pause = Status(start_time=ts(50), deadline={"pausedSeconds": 15.0, "pausedSince": ts(10)})
    assert left(spec, open_pause, NOW) == 35.0


def test_a_running_training_past_its_deadline_fails_without_a_restart_and_its_job_goes() -> None:
    running = job(active=2, ready=2, startTime=ts(61))
    p = plan(body({"phase": api.RUNNING, "startTime": ts(61), "restarts": 0, "attempt": 0}), running)
    assert p.status.phase == api.FAILED and p.status.restarts == 0
    assert next(c for c in p.status.conditions if c["type"] == "Failed")["reason"] == "DeadlineExceeded"
    assert "spec.activeDeadlineSeconds=60 ran out" in p.status.message
    assert p.delete == [{"apiVersion": "batch/v1", "kind": "Job", "name": "pets", "namespace": "ns"}]
    assert p.create == []
    assert [e.reason for e in p.events if e.type == "Warning"] == ["DeadlineExceeded", api.FAILED]


def test_before_the_deadline_it_runs_and_wakes_when_the_deadline_comes() -> None:
    running = job(active=2, ready=2, startTime=ts(20))
    p = plan(body({"phase": api.RUNNING, "startTime": ts(20), "attempt": 0}), running)
    assert p.status.phase == api.RUNNING
    assert p.requeue_after is not None and p.requeue_after <= 40.0


def test_the_jobs_own_deadline_ending_it_is_not_a_gang_restart() -> None:
    failed = job(conditions=[{"type": "Failed", "reason": "DeadlineExceeded",
                              "message": "Job was active longer than specified deadline"}], startTime=ts(60))
    p = plan(body({"phase": api.RUNNING, "startTime": ts(60), "restarts": 0, "attempt": 0}, maxRestarts=3),
             failed)
    assert p.status.phase == api.FAILED and p.status.restarts == 0 and p.status.attempt == 0
    assert next(c for c in p.status.conditions if c["type"] == "Failed")["reason"] == "DeadlineExceeded"
    assert p.create == []


def test_a_gang_restart_gives_the_next_job_what_is_left() -> None:
    after_restart = {"phase": api.RESTARTING, "startTime": ts(25), "restarts": 1, "attempt": 1,
                     "children": {"networkPolicy": "pets"}}  # made with attempt 0
    p = plan(body(after_restart), None)
    assert [m["metadata"]["name"] for m in p.create] == ["pets-output", "pets-r1"]  # the claim first
    assert p.create[-1]["spec"]["activeDeadlineSeconds"] == 35


def test_a_restart_after_the_deadline_ran_out_creates_nothing() -> None:
    after_restart = {"phase": api.RESTARTING, "startTime": ts(61), "restarts": 1, "attempt": 1}
    p = plan(body(after_restart), None)
    assert p.create == [] and p.status.phase == api.FAILED
    assert next(c for c in p.status.conditions if c["type"] == "Failed")["reason"] == "DeadlineExceeded"


def test_time_suspended_does_not_count() -> None:
    # Started 100 s ago with a 60 s deadline, but suspended for the last 50 s: 10 s left.
    suspended = job(suspend=True, startTime=ts(100))
    st = {"phase": api.SUSPENDED, "startTime": ts(100), "attempt": 0}
    p = plan(body(st, suspend=True), suspended)
    assert p.status.phase == api.SUSPENDED
    assert p.status.deadline["pausedSince"] == ts(0)
    # 50 s later it is resumed: the 50 s are booked as paused, and 10 s are left.
    st_then = {**p.status.to_dict(), "deadline": {"pausedSince": ts(50)}}
    resumed = plan(body(st_then), job(active=2, ready=2, startTime=ts(0)))
    assert resumed.status.phase != api.FAILED, resumed.status.message
    assert resumed.status.deadline == {"pausedSeconds": 50.0}
    assert left(api.resolve_spec({"activeDeadlineSeconds": 60}), resumed.status, NOW) == 10.0


def test_without_a_deadline_no_bookkeeping_is_written() -> None:
    b = {"metadata": {"name": "pets", "namespace": "ns", "generation": 1, "uid": "u1"}, "spec": {},
         "status": {"phase": api.RUNNING, "startTime": ts(1000), "attempt": 0}}
    spec = api.resolve_spec({})
    target = builders.Target("pets", "ns")
    running = children.build_job(spec, target)
    running["metadata"]["annotations"][api.ANNOTATION_SPEC_DIGEST] = builders.spec_digest(spec)
    running["status"] = {"active": 2, "ready": 2}
    p = planner.plan(Round.of(b, spec, plan_types.Observed(backend=backends.JOB, workload=running,
                                             service=backends.JOB.build_service(spec, target)), target, NOW))
    assert p.status.deadline is None and "activeDeadlineSeconds" not in running["spec"]
