"""spec.activeDeadlineSeconds: the time a training may run, paused time (Suspended, Queued, Preempted)
not counted, and the end of one that ran out; and spec.scheduling.pendingTimeoutSeconds, the time it may
wait to start."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pets_operator import api
from pets_operator.backends import parse_timestamp, timestamp
from pets_operator.plan_types import Event, Observed, Plan, ref
from pets_operator.spec import Spec
from pets_operator.status_types import Status

# Phases whose time does not count against spec.activeDeadlineSeconds.
PAUSED_PHASES = (api.SUSPENDED, api.QUEUED, api.PREEMPTED)


# A workload that failed this close to the training's deadline was ended by it (its own deadline is what
# was left, rounded up to whole seconds).
DEADLINE_SLACK_SECONDS = 2.0


@dataclass(frozen=True)
class Paused:
    """status.deadline, typed: the time paused so far, which the deadline does not count."""

    seconds: float | None = None  # pausedSeconds: the pauses that ended
    since: str | None = None  # pausedSince: when the pause going on began

    @classmethod
    def of(cls, status: Status) -> Paused:
        book = status.deadline or {}
        return cls(book.get("pausedSeconds"), book.get("pausedSince"))

    def total(self, now: datetime) -> float:
        ongoing = max(0.0, (now - parse_timestamp(self.since)).total_seconds()) if self.since else 0.0
        return float(self.seconds or 0.0) + ongoing

    def to_dict(self) -> dict[str, Any]:
        return {key: value for key, value in (("pausedSeconds", self.seconds), ("pausedSince", self.since))
                if value is not None}


def deadline_left(spec: Spec, status: Status, now: datetime) -> float | None:
    """Seconds left of spec.activeDeadlineSeconds, counted from status.startTime without the time paused
    (status.deadline); None without a deadline. Before the training has started, all of it."""
    if not (limit := spec.active_deadline_seconds):
        return None
    if not (start := status.start_time):
        return float(limit)
    return float(limit) - ((now - parse_timestamp(start)).total_seconds() - Paused.of(status).total(now))


def watch_deadline(result: Plan, spec: Spec, observed: Observed, decided: tuple[str, str, str],
                    now: datetime) -> tuple[str, str, str]:
    """Book this round's pause (Suspended, Queued, Preempted) and end the training once its deadline has
    run out while it was not paused; else wake it when the deadline comes."""
    status, phase = result.status, decided[0]
    paused = Paused.of(status)
    if phase in PAUSED_PHASES:
        status.deadline = Paused(paused.seconds, paused.since or timestamp(now)).to_dict()
        return decided
    if paused.since:
        paused = Paused(round(paused.total(now), 3))
    status.deadline = paused.to_dict()
    left = deadline_left(spec, status, now)
    if left is None:
        return decided
    if left <= 0 and status.start_time:
        return deadline_exceeded(result, spec, observed.workload, now)
    result.requeue_after = left if result.requeue_after is None else min(result.requeue_after, left)
    return decided


def deadline_exceeded(result: Plan, spec: Spec, workload: dict[str, Any] | None,
                       now: datetime) -> tuple[str, str, str]:
    """The training's deadline ran out: Failed, no restart, no new workload; the running one goes."""
    status = result.status
    status.pending_since = None
    status.completion_time = timestamp(now)
    if workload is not None:
        result.delete.append(ref(workload))
    paused = float(Paused.of(status).seconds or 0.0)
    message = (f"spec.activeDeadlineSeconds={spec.active_deadline_seconds} ran out (counted from "
               f"{status.start_time}, {paused:.0f} s Suspended, Queued or Preempted not counted); "
               "not restarted")
    result.events.append(Event("Warning", "DeadlineExceeded", message))
    return api.FAILED, "DeadlineExceeded", message


def pending_timed_out(result: Plan, spec: Spec, now: datetime) -> str | None:
    """Waiting for the pods to start: status.pendingSince (kept from the first such round). Once
    spec.scheduling.pendingTimeoutSeconds has passed, why the training fails (and its end is set);
    before, the next round comes by then at the latest."""
    status = result.status
    status.pending_since = status.pending_since or timestamp(now)
    timeout = (spec.scheduling or {}).get("pendingTimeoutSeconds")
    if timeout is None:
        return None
    waited = (now - parse_timestamp(status.pending_since)).total_seconds()
    if waited >= timeout:
        status.completion_time = timestamp(now)
        status.pending_since = None
        return f"did not start within spec.scheduling.pendingTimeoutSeconds={timeout}"
    left = max(0.0, timeout - waited)
    result.requeue_after = left if result.requeue_after is None else min(result.requeue_after, left)
    return None
