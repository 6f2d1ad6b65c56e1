"""spec.activeDeadlineSeconds: the time a training may run, paused time (Suspended, Queued, Preempted)
not counted, and the end of one that ran out; and spec.scheduling.pendingTimeoutSeconds, the time it may
wait to start."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pets_operator import api
from pets_operator.plan_types import Event, Plan, Round, ref
from pets_operator.status_types import Status
from pets_operator.timestamps import parse_timestamp, timestamp

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


def deadline_left(r: Round, plan: Plan) -> float | None:
    """Seconds left of spec.activeDeadlineSeconds, counted from status.startTime without the time paused
    (status.deadline); None without a deadline. Before the training has started, all of it."""
    status = plan.status
    if not (limit := r.spec.active_deadline_seconds):
        return None
    if not (start := status.start_time):
        return float(limit)
    return float(limit) - ((r.now - parse_timestamp(start)).total_seconds() - Paused.of(status).total(r.now))


def watch_deadline(r: Round, plan: Plan) -> None:
    """Book this round's pause (Suspended, Queued, Preempted) and end the training once its deadline has
    run out while it was not paused (its workload goes); else wake it when the deadline comes."""
    assert plan.verdict is not None
    status, phase, now = plan.status, plan.verdict[0], r.now
    paused = Paused.of(status)
    if phase in PAUSED_PHASES:
        status.deadline = Paused(paused.seconds, paused.since or timestamp(now)).to_dict()
        return
    if paused.since:
        paused = Paused(round(paused.total(now), 3))
    status.deadline = paused.to_dict()
    left = deadline_left(r, plan)
    if left is None:
        return
    if left <= 0 and status.start_time:
        if r.observed.workload is not None:
            plan.delete.append(ref(r.observed.workload))
        exceeded(r, plan)
        return
    plan.requeue_after = left if plan.requeue_after is None else min(plan.requeue_after, left)


def exceeded(r: Round, plan: Plan) -> None:
    """The training's deadline ran out: Failed, no restart, no new workload."""
    status, now = plan.status, r.now
    status.pending_since = None
    status.completion_time = timestamp(now)
    paused = float(Paused.of(status).seconds or 0.0)
    message = (f"spec.activeDeadlineSeconds={r.spec.active_deadline_seconds} ran out (counted from "
               f"{status.start_time}, {paused:.0f} s Suspended, Queued or Preempted not counted); "
               "not restarted")
    plan.events.append(Event("Warning", "DeadlineExceeded", message))
    plan.verdict = (api.FAILED, "DeadlineExceeded", message)


def pending_timed_out(r: Round, plan: Plan) -> str | None:
    """Waiting for the pods to start: status.pendingSince (kept from the first such round). Once
    spec.scheduling.pendingTimeoutSeconds has passed, why the training fails (and its end is set);
    before, the next round comes by then at the latest."""
    status, now = plan.status, r.now
    status.pending_since = status.pending_since or timestamp(now)
    timeout = (r.spec.scheduling or {}).get("pendingTimeoutSeconds")
    if timeout is None:
        return None
    waited = (now - parse_timestamp(status.pending_since)).total_seconds()
    if waited >= timeout:
        status.completion_time = timestamp(now)
        status.pending_since = None
        return f"did not start within spec.scheduling.pendingTimeoutSeconds={timeout}"
    left = max(0.0, timeout - waited)
    plan.requeue_after = left if plan.requeue_after is None else min(plan.requeue_after, left)
    return None
