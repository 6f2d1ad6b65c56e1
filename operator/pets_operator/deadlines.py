"""spec.activeDeadlineSeconds: the time a training may run, paused time (Suspended, Queued, Preempted)
not counted, and the end of one that ran out."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pets_operator import api
from pets_operator.backends import parse_timestamp, timestamp
from pets_operator.plan_types import Event, Observed, Plan, ref
from pets_operator.spec import Spec

# Phases whose time does not count against spec.activeDeadlineSeconds.
PAUSED_PHASES = (api.SUSPENDED, api.QUEUED, api.PREEMPTED)


# A workload that failed this close to the training's deadline was ended by it (its own deadline is what
# was left, rounded up to whole seconds).
DEADLINE_SLACK_SECONDS = 2.0


def deadline_left(spec: Spec, status: dict[str, Any], now: datetime) -> float | None:
    """Seconds left of spec.activeDeadlineSeconds, counted from status.startTime without the time paused
    (status.deadline); None without a deadline. Before the training has started, all of it."""
    limit = spec.active_deadline_seconds
    if not limit:
        return None
    start = status.get("startTime")
    if not start:
        return float(limit)
    book = status.get("deadline") or {}
    paused = float(book.get("pausedSeconds") or 0.0)
    if book.get("pausedSince"):
        paused += max(0.0, (now - parse_timestamp(book["pausedSince"])).total_seconds())
    return float(limit) - ((now - parse_timestamp(start)).total_seconds() - paused)


def watch_deadline(result: Plan, spec: Spec, observed: Observed, decided: tuple[str, str, str],
                    now: datetime) -> tuple[str, str, str]:
    """Book this round's pause (Suspended, Queued, Preempted) and end the training once its deadline has
    run out while it was not paused; else wake it when the deadline comes."""
    status, phase = result.status, decided[0]
    book = status.setdefault("deadline", {})
    if phase in PAUSED_PHASES:
        book.setdefault("pausedSince", timestamp(now))
        return decided
    if book.get("pausedSince"):
        pause = max(0.0, (now - parse_timestamp(book.pop("pausedSince"))).total_seconds())
        book["pausedSeconds"] = round(float(book.get("pausedSeconds") or 0.0) + pause, 3)
    left = deadline_left(spec, status, now)
    if left is None:
        return decided
    if left <= 0 and status.get("startTime"):
        return deadline_exceeded(result, spec, observed.workload, now)
    result.requeue_after = left if result.requeue_after is None else min(result.requeue_after, left)
    return decided


def deadline_exceeded(result: Plan, spec: Spec, workload: dict[str, Any] | None,
                       now: datetime) -> tuple[str, str, str]:
    """The training's deadline ran out: Failed, no restart, no new workload; the running one goes."""
    status = result.status
    status.pop("pendingSince", None)
    status["completionTime"] = timestamp(now)
    if workload is not None:
        result.delete.append(ref(workload))
    paused = float((status.get("deadline") or {}).get("pausedSeconds") or 0.0)
    message = (f"spec.activeDeadlineSeconds={spec.active_deadline_seconds} ran out (counted from "
               f"{status.get('startTime')}, {paused:.0f} s Suspended, Queued or Preempted not counted); "
               "not restarted")
    result.events.append(Event("Warning", "DeadlineExceeded", message))
    return api.FAILED, "DeadlineExceeded", message
