"""Rank 0's run that ended as its pod went (ended_runs.py): a resize, a restart or a Kueue preemption
deletes the pod right after its trainer wrote its summary, and kopf's index drops it before the round
that would read it. The pod watch keeps the summary (Context.keep_ended); the next round books it."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest
from kubernetes import client
from pets_operator import api, context, ended_runs, handlers, runner, workqueue
from pets_operator.plan_types import EndedRun
from pets_operator.settings import Settings
from pets_operator.timestamps import timestamp
from test_operator_resize import RUNNING, plan, sized_job
from test_operator_status import NOW

pytestmark = pytest.mark.unit

KEY = ("ns", "pets")
STARTED = timestamp(NOW - timedelta(seconds=60))
SPLIT = {"startup": 5.0, "train": 40.0, "eval": 2.0, "checkpoint": 1.0, "restore": 0.5}
SUMMARY = {"status": "stopped", "global_step": 80, "resume_step": 0, "time_seconds": SPLIT}


def gone_pod(rank: int = 0, attempt: int = 0, summary: dict[str, Any] | None = SUMMARY,
             world_size: int = 2) -> dict[str, Any]:
    """A trainer pod as its DELETED event carries it: stopped on SIGTERM (exit 75), its summary written."""
    term = {"exitCode": 75, "reason": "Error", "startedAt": STARTED, "finishedAt": timestamp(NOW)}
    if summary is not None:
        term["message"] = json.dumps(summary)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"pets-{rank}-x", "namespace": "ns", "resourceVersion": "40",
                         "deletionTimestamp": timestamp(NOW),
                         "labels": {api.LABEL_TRAINING: "pets", api.LABEL_MANAGED_BY: api.MANAGED_BY,
                                    api.LABEL_ATTEMPT: str(attempt), "job-name": "pets",
                                    "batch.kubernetes.io/job-completion-index": str(rank)}},
            "spec": {"containers": [{"name": "trainer", "env": [
                {"name": "PETS_NUM_MACHINES", "value": str(world_size)}]}]},
            "status": {"phase": "Failed", "containerStatuses": [
                {"name": "trainer", "state": {"terminated": term}}]}}


def training(st: dict[str, Any], rv: str = "5") -> dict[str, Any]:
    return {"metadata": {"name": "pets", "namespace": "ns", "resourceVersion": rv}, "spec": {"replicas": 1},
            "status": st}


def ctx_with(st: dict[str, Any]) -> context.Context:
    """The indices after the pod went: the training, no pod."""
    indices = {context.TRAININGS_INDEX: {KEY: [training(st)]}, context.JOBS_INDEX: {},
               context.PODS_INDEX: {}, context.SERVICES_INDEX: {}}
    return context.Context(api_client=None, indices=indices)  # type: ignore[arg-type]


def resized() -> dict[str, Any]:
    """A gang of 2 listed at its start (no progress read yet), then scaled to 1: its Job is deleted."""
    listed = plan(RUNNING, {"replicas": 2}, sized_job(2, active=2, ready=2), rank0_running_since=STARTED)
    assert listed.status.goodput["attempts"] == [{"attempt": 0, "startedAt": STARTED, "worldSize": 2}]
    drained = plan(listed.status.to_dict(), {"replicas": 1}, sized_job(2, active=2, ready=2))
    assert drained.delete and drained.status.attempt == 1
    return drained.status.to_dict()


def test_a_rank_0_pod_that_goes_with_a_summary_is_a_run_that_ended() -> None:
    assert ended_runs.of_pod(gone_pod()) == EndedRun(0, STARTED, SUMMARY, 2)
    assert ended_runs.of_pod(gone_pod(attempt=3, world_size=4)) == EndedRun(3, STARTED, SUMMARY, 4)
    assert ended_runs.of_pod(gone_pod(rank=1)) is None  # rank 0's summary is the run's
    assert ended_runs.of_pod(gone_pod(summary=None)) is None
    assert ended_runs.of_pod(gone_pod(summary={"status": "failed", "error": "boom"})) is None  # no split
    unlabelled = gone_pod()
    del unlabelled["metadata"]["labels"][api.LABEL_ATTEMPT]
    assert ended_runs.of_pod(unlabelled) is None


def test_a_round_after_the_pod_left_the_index_books_the_runs_split_from_its_summary() -> None:
    st = resized()
    ctx = ctx_with(st)
    ctx.keep_ended(KEY, ended_runs.of_pod(gone_pod()))
    snap = ctx.snapshot(KEY)
    assert snap is not None and snap.pods == [] and snap.ended == (EndedRun(0, STARTED, SUMMARY, 2),)
    later = NOW + timedelta(seconds=5)
    without = plan(st, {"replicas": 1}, None, now=later)
    assert "trainSeconds" not in without.status.goodput["attempts"][0]  # what the round saw before
    booked = plan(st, {"replicas": 1}, None, now=later, ended_runs=snap.ended)
    run = booked.status.goodput["attempts"][0]
    assert run == {"attempt": 0, "startedAt": STARTED, "worldSize": 2, "firstStep": 0, "startupSeconds": 5.0,
                   "trainSeconds": 40.0, "evalSeconds": 2.0, "checkpointSeconds": 1.0,
                   "restoreSeconds": 0.5, "lastStep": 80}  # its own size, not the 1 the training has now
    assert booked.status.replicas == 1
    book = booked.status.goodput
    assert (without.status.goodput["productiveSeconds"], book["productiveSeconds"]) == (0.0, 40.0)
    assert (book["startupSeconds"], book["evalSeconds"], book["checkpointSeconds"]) == (5.0, 2.0, 1.0)
    # Kept until the stored status holds it (a write held back books it again), then forgotten.
    assert ctx.snapshot(KEY).ended == snap.ended  # type: ignore[union-attr]
    ctx.indices[context.TRAININGS_INDEX][KEY] = [training(booked.status.to_dict(), rv="6")]
    assert ctx.snapshot(KEY).ended == ()  # type: ignore[union-attr]
    assert KEY not in ctx.ended


def test_a_run_booked_from_its_pod_and_kept_too_is_booked_once() -> None:
    """The pod is still listed (its gang failed, its summary read by the round) and kept as it goes."""
    st = {**RUNNING, "goodput": {"attempts": [{"attempt": 0, "startedAt": STARTED, "worldSize": 2}]}}
    failed = sized_job(2, failed=1, conditions=[{"type": "Failed", "status": "True",
                                                 "reason": "BackoffLimitExceeded", "message": "limit"}])
    pod = gone_pod()
    kept = (ended_runs.of_pod(pod),)
    common = {"pods": [pod], "summary": SUMMARY, "rank0_running_since": STARTED}
    once = plan(st, {"replicas": 2}, failed, **common)
    both = plan(st, {"replicas": 2}, failed, ended_runs=kept, **common)
    assert both.status.phase == api.RESTARTING
    assert both.status.goodput == once.status.goodput and len(both.status.goodput["attempts"]) == 1
    assert both.status.goodput["productiveSeconds"] == 40.0
    # Booked again in a later round, it changes nothing: the stored status holds it.
    assert ended_runs.settled(both.status.to_dict(), kept) == list(kept)


def test_a_kept_run_whose_attempt_has_a_later_run_listed_is_dropped_not_booked_out_of_order() -> None:
    later_run = timestamp(NOW)
    st = {**RUNNING, "goodput": {"attempts": [{"attempt": 0, "startedAt": later_run, "worldSize": 2}]}}
    kept = (EndedRun(0, STARTED, SUMMARY, 2),)
    p = plan(st, {"replicas": 2}, sized_job(2, active=2, ready=2), ended_runs=kept)
    assert p.status.goodput["attempts"] == st["goodput"]["attempts"]
    assert ended_runs.settled(st, kept) == list(kept)
    # A newer run than any listed is booked as a run of its own, after them.
    newer = EndedRun(1, STARTED, SUMMARY, 1)
    assert ended_runs.settled(st, [newer]) == []
    p = plan(st, {"replicas": 2}, sized_job(2, active=2, ready=2), ended_runs=(newer,))
    assert [(r["attempt"], r["startedAt"]) for r in p.status.goodput["attempts"]] == [
        (0, later_run), (1, STARTED)]


def test_kept_runs_are_few_and_go_with_the_training() -> None:
    ctx = ctx_with(RUNNING)
    for attempt in range(ended_runs.KEPT + 2):
        ctx.keep_ended(KEY, EndedRun(attempt, STARTED, SUMMARY))
    ctx.keep_ended(KEY, None)
    assert [a for a, _ in ctx.ended[KEY]] == list(range(2, ended_runs.KEPT + 2))  # the newest
    ctx.forget(KEY)
    assert ctx.ended == {}
    # A finished training books nothing more: what is kept is dropped at its next snapshot.
    ctx = ctx_with({**RUNNING, "phase": api.SUCCEEDED})
    ctx.keep_ended(KEY, EndedRun(0, STARTED, SUMMARY))
    assert ctx.snapshot(KEY).ended == () and ctx.ended == {}  # type: ignore[union-attr]


def test_the_pod_watch_keeps_rank_0s_summary_as_its_pod_goes() -> None:
    cfg = client.Configuration()
    cfg.host = "https://api.example:6443"
    registry, ctx = runner.build(Settings(), cfg)
    (watch,) = [h for h in registry._watching.get_all_handlers()  # noqa: SLF001 - no public lister
                if h.id == handlers.POD_WATCH_ID]

    async def events() -> None:
        ctx.queue = workqueue.WorkQueue()  # started: the handler only wakes the training
        pod = gone_pod()
        running = {**pod, "metadata": {k: v for k, v in pod["metadata"].items() if k != "deletionTimestamp"}}
        for event, body in (("MODIFIED", running), ("DELETED", gone_pod(rank=1)), ("DELETED", pod)):
            await watch.fn(event={"type": event, "object": body}, namespace="ns",  # type: ignore[call-arg]
                           labels=body["metadata"]["labels"], body=body)

    asyncio.run(events())
    assert list(ctx.ended[KEY].values()) == [EndedRun(0, STARTED, SUMMARY, 2)]
