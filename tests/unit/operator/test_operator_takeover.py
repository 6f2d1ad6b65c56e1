"""A replica that takes over never writes an older status over a newer one. `make chaos` saw status.step
go back within an attempt (22 to 16, 13 to 5) right after the acting replica's pod was deleted: the
replica that took over planned from indices frozen while it stood by, with a reading its scraper took
before the lost replica's last write. Now it reads each training afresh once when it starts to act
again (context.Context.reread), and a reading older than the status's lastProgressTime is not
mirrored (mirror.progress)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from operator_specs import round_of  # tests/unit/operator/operator_specs.py
from pets_operator import api, backends, builders, context, mirror, plan_types
from pets_operator import plan as planner
from pets_operator.plan_types import Round
from pets_operator.progress import parse_progress
from pets_operator.status_types import Status
from pets_operator.timestamps import timestamp

from pets_contract import gauges

pytestmark = pytest.mark.unit

KEY = ("ns", "pets")
NOW = datetime(2026, 11, 27, 21, 0, tzinfo=UTC)


def training(rv: int, step: int) -> dict[str, Any]:
    return {"apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": api.KIND,
            "metadata": {"name": "pets", "namespace": "ns", "resourceVersion": str(rv), "uid": "u1"},
            "spec": {"replicas": 1, "epochs": 5}, "status": {"phase": api.RUNNING, "step": step}}


def ctx_over(indexed: dict[str, Any]) -> context.Context:
    indices = {context.TRAININGS_INDEX: {KEY: [indexed]}, context.JOBS_INDEX: {}, context.PODS_INDEX: {},
               context.SERVICES_INDEX: {}}
    return context.Context(api_client=None, indices=indices)  # type: ignore[arg-type]


def mirrored(read_at: datetime | None, shown: Status) -> bool:
    r = round_of(shown, progress={gauges.BY_KEY["step"].name: 7.0}, progress_read_at=read_at)
    p = plan_types.Plan(status=shown.copy())
    mirror.progress(r, p)
    return p.status.step == 7


def test_a_reading_older_than_the_status_shows_is_not_mirrored() -> None:
    shown = Status(last_progress_time=timestamp(NOW))
    assert not mirrored(NOW - timedelta(seconds=3), shown)
    assert mirrored(NOW + timedelta(seconds=3), shown)
    assert mirrored(NOW, shown)  # the same second: ours may well be the newer
    assert mirrored(None, shown) and mirrored(NOW, Status())


def plan_with(old_status: dict[str, Any], read_at: datetime) -> dict[str, Any]:
    b = {**training(9, 0), "status": old_status}
    spec = api.resolve_spec(b["spec"])
    target = builders.Target("pets", "ns", 0)
    workload = backends.JOB.build_workload(spec, target)
    workload["status"] = {"active": 1, "ready": 1, "startTime": timestamp(NOW - timedelta(minutes=2))}
    workload["metadata"]["annotations"][api.ANNOTATION_SPEC_DIGEST] = builders.spec_digest(spec)
    progress = parse_progress("# TYPE pets_step gauge\npets_step 16\n")
    observed = plan_types.Observed(backend=backends.JOB, workload=workload,
                                   service=backends.JOB.build_service(spec, target), progress=progress,
                                   progress_read_at=read_at)
    return planner.plan(Round.of(b, spec, observed, target, NOW)).status.to_dict()


def test_a_stale_reading_does_not_take_the_step_back_and_a_newer_one_moves_it() -> None:
    # The lost replica read step 22 and wrote it 2 s ago; our scraper read 16 five seconds ago.
    written = {"phase": api.RUNNING, "attempt": 0, "step": 22,
               "lastProgressTime": timestamp(NOW - timedelta(seconds=2))}
    assert plan_with(written, NOW - timedelta(seconds=5))["step"] == 22
    # A reading after the status's own: mirrored, even though lower (a resume goes back; its reading is new)
    assert plan_with(written, NOW - timedelta(seconds=1))["step"] == 16


class Reader:
    """Context.read_training's answer, as the API server would give it."""

    def __init__(self, body: dict[str, Any] | None) -> None:
        self.body, self.reads = body, 0

    def __call__(self, key: Any) -> dict[str, Any] | None:
        self.reads += 1
        return self.body


def test_after_standing_by_each_training_is_read_once_and_the_newer_body_is_planned_from() -> None:
    ctx = ctx_over(training(5, 10))  # frozen while it stood by
    assert not ctx.needs_reread(KEY)  # never stood by: its indices were listed fresh
    ctx.stood_by()
    assert ctx.needs_reread(KEY)
    reader = Reader(training(8, 22))  # what the other replica wrote meanwhile
    ctx.reread_as(KEY, reader(KEY))
    assert not ctx.needs_reread(KEY)
    snap = ctx.snapshot(KEY)
    assert snap is not None and snap.body["status"]["step"] == 22

    # An older answer (the index caught up first) changes nothing; a training gone (None) is not kept
    ctx = ctx_over(training(9, 30))
    ctx.stood_by()
    ctx.reread_as(KEY, training(8, 22))
    snap = ctx.snapshot(KEY)
    assert snap is not None and snap.body["status"]["step"] == 30
    ctx.stood_by()
    ctx.reread_as(KEY, None)
    assert not ctx.needs_reread(KEY) and KEY not in ctx.written
