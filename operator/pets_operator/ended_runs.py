"""Runs of rank 0 that ended as their pod went: their final summary, kept until a round books it.

When the operator deletes a workload (a restart, a resize) or Kueue suspends it (a preemption), rank 0
stops on SIGTERM and writes its final summary as its termination message; then its pod is deleted, and
kopf's index drops it, often before the next round: that round would not see the run's split. So the pod
watch keeps it (`of_pod`, into Context.ended), every round books what is kept (`book`) before it reads
the current pods, and a kept run is forgotten once the stored status holds it (`settled`): a status
write held back (pacing.py) or refused leaves it kept, and the next round books it again.
Pure functions; time is not needed.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable
from typing import Any

from pets_contract import env as contract_env
from pets_contract import summary as summary_keys
from pets_operator import api, backends, goodput, pods
from pets_operator.plan_types import EndedRun
from pets_operator.status_types import Status
from pets_operator.timestamps import parse_timestamp

KEPT = 4  # runs kept a training, the newest: a round books them within seconds


def of_pod(pod: dict[str, Any]) -> EndedRun | None:
    """The run a trainer pod ended, where it is rank 0 of an attempt and its container ended with a
    summary that splits its time (None otherwise). `pod`: the whole object, as the watch gives it."""
    meta = pod.get("metadata") or {}
    attempt = str((meta.get("labels") or {}).get(api.LABEL_ATTEMPT) or "")
    if pod.get("kind") != "Pod" or not attempt.isdigit() or \
            not any(backend.rank_of(pod) == 0 for backend in backends.BACKENDS.values()):
        return None
    summary, started = pods.final_summary(pod)
    if summary is None or started is None or not isinstance(summary.get(summary_keys.TIME_SECONDS), dict):
        return None
    sizes = [e.get("value") for c in (pod.get("spec") or {}).get("containers") or []
             for e in c.get("env") or [] if e.get("name") == contract_env.NUM_MACHINES]
    size = str(sizes[0]) if sizes else ""
    return EndedRun(int(attempt), started, summary, int(size) if size.isdigit() else None)


def _bookable(book: dict[str, Any], run: EndedRun) -> bool:
    """Its own entry is there to update, or it is newer than every run listed (goodput lists them in
    order): a run that is neither was followed by one already listed, and its entry is gone."""
    runs = book.get("attempts") or []
    same = next((r for r in reversed(runs) if r.get("attempt") == run.attempt), None)
    if same is not None and same.get("startedAt") in (None, run.started):
        return True
    if not runs:
        return True
    last = runs[-1]
    if int(last.get("attempt") or 0) != run.attempt:
        return int(last.get("attempt") or 0) < run.attempt
    return parse_timestamp(str(last["startedAt"])) < parse_timestamp(run.started)


def book(status: Status, runs: Iterable[EndedRun]) -> None:
    """Each run's summary into status.goodput (goodput.read_summary), at its own world size, not the size
    the training has now (a resize's next attempt)."""
    for run in runs:
        if not _bookable(status.goodput or {}, run):
            continue
        at_its_size = dataclasses.replace(status, replicas=run.world_size)
        goodput.read_summary(at_its_size, run.attempt, run.started, run.summary)
        status.goodput = at_its_size.goodput


def settled(stored: dict[str, Any], runs: Iterable[EndedRun]) -> list[EndedRun]:
    """The runs the stored status (a dict, as read) holds already (booking them again would change
    nothing), or can no longer take; all of them once the training has finished."""
    if stored.get("phase") in api.FINISHED_PHASES:
        return list(runs)
    book_now = stored.get("goodput") or {}
    done = []
    for run in runs:
        probe = Status(goodput=copy.deepcopy(book_now))
        book(probe, [run])
        if probe.goodput == book_now:
            done.append(run)
    return done
