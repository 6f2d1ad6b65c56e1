"""A child the indices still show after it went: a replica that stood by (kopf's peering pauses its
watches) never sees the DELETED event of what went meanwhile, and kopf's re-listing when it takes over
removes nothing from its indices. The API server's 404 to a delete tells the operator; from then on its
snapshots leave that child out (context.Context.gone), and a workload that shows as deleting for long is
asked again (reconcile.DELETING_RECHECK). `make chaos` found a gang restart waiting for ever on such a Job."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pets_operator import act, context, plan_types
from pets_operator.status_types import Status
from pets_operator.timestamps import timestamp

pytestmark = pytest.mark.unit

KEY = ("ns", "pets")


def job(name: str, created: datetime) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": "7",
                         "creationTimestamp": timestamp(created)}}


def ctx_with(jobs: list[dict[str, Any]]) -> context.Context:
    training = {"metadata": {"name": "pets", "namespace": "ns", "resourceVersion": "5"}, "status": {}}
    indices = {context.TRAININGS_INDEX: {KEY: [training]}, context.JOBS_INDEX: {KEY: jobs},
               context.PODS_INDEX: {}, context.SERVICES_INDEX: {}}
    return context.Context(api_client=None, indices=indices)  # type: ignore[arg-type]


class Cluster:
    """The calls carry_out makes, against an API server that has none of the children it deletes."""

    namespace, name = KEY
    key = KEY

    def __init__(self) -> None:
        self.deleted: list[str] = []

    def patch_status(self, patch: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": self.name, "namespace": self.namespace}, "status": patch}

    def delete(self, ref: dict[str, Any]) -> bool:
        self.deleted.append(ref["name"])
        return False  # 404

    def force_delete_pod(self, name: str, uid: str | None = None) -> bool:
        self.deleted.append(name)
        return False


def test_a_child_the_api_server_says_is_gone_leaves_the_snapshot_and_a_new_one_of_its_name_does_not() -> None:
    made = datetime.now(UTC) - timedelta(minutes=5)
    ctx = ctx_with([job("pets", made), job("pets-r1", made)])
    snap = ctx.snapshot(KEY)
    assert snap is not None and [j["metadata"]["name"] for j in snap.jobs] == ["pets", "pets-r1"]

    ctx.gone_now("Job", "ns", "pets")
    snap = ctx.snapshot(KEY)
    assert snap is not None and [j["metadata"]["name"] for j in snap.jobs] == ["pets-r1"]

    ctx.indices[context.JOBS_INDEX][KEY][0] = job("pets", datetime.now(UTC) + timedelta(seconds=2))
    snap = ctx.snapshot(KEY)
    assert snap is not None and [j["metadata"]["name"] for j in snap.jobs] == ["pets", "pets-r1"]


def test_a_delete_answered_404_marks_the_child_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(act.kopf, "event", lambda *_a, **_k: None)
    ctx = ctx_with([job("pets", datetime.now(UTC) - timedelta(minutes=5))])
    body = ctx.snapshot(KEY).body  # type: ignore[union-attr]
    plan = plan_types.Plan(status=Status(phase="Restarting"))
    plan.delete = [{"apiVersion": "batch/v1", "kind": "Job", "name": "pets", "namespace": "ns"}]
    plan.force_delete = [{"name": "pets-0-abcde", "uid": "u1"}]
    cl = Cluster()
    act.carry_out(ctx, cl, body, plan, logging.getLogger("test"))  # type: ignore[arg-type]
    assert cl.deleted == ["pets-0-abcde", "pets"]
    assert set(ctx.gone) == {("Job", "ns", "pets"), ("Pod", "ns", "pets-0-abcde")}
    assert ctx.snapshot(KEY).jobs == []  # type: ignore[union-attr]
