"""Progress that stops: the Stalled condition (no step for longer than the run's pace allows) and the
ProgressReported condition (rank 0's endpoint answers, or why not)."""

from __future__ import annotations

from pets_operator import api
from pets_operator.plan_types import Event, Plan, Round, set_condition
from pets_operator.timestamps import parse_timestamp


def stalled(r: Round, plan: Plan) -> None:
    """Stalled: a Running training whose progress has not moved for longer than its own pace allows."""
    status, now, generation = plan.status, r.now, r.generation
    bound = stall_bound(r, plan)
    last = status.last_progress_time or status.start_time
    if status.phase != api.RUNNING or bound is None or not last:
        if any(c["type"] == "Stalled" for c in status.conditions or []):
            set_condition(status, "Stalled", False, "NotRunning", "", now, generation)
        return
    quiet = (now - parse_timestamp(last)).total_seconds()
    stalled = quiet > bound
    was = next((c for c in status.conditions or [] if c["type"] == "Stalled" and c["status"] == "True"), None)
    message = (f"no progress since {last} ({quiet:.0f} s, more than {bound:.0f} s)" if stalled else "")
    set_condition(status, "Stalled", stalled, "NoProgress" if stalled else "Progressing",
                   message, now, generation)
    if stalled and not was:
        plan.events.append(Event("Warning", "Stalled", message))
    if not stalled:
        left = bound - quiet
        plan.requeue_after = left if plan.requeue_after is None else min(plan.requeue_after, left)


PROGRESS_GRACE_SECONDS = 30.0  # the trainer serves its gauges a few seconds after it starts


# Reads must have failed this long (a second scrape, 10 s after the first) before status says so.
PROGRESS_CONFIRM_SECONDS = 15.0


def progress_reported(r: Round, plan: Plan) -> None:
    """ProgressReported: False, with the reason, when a running rank 0's gauges cannot be read (a
    NetworkPolicy, a crashed metrics server, a wrong port); one Warning Event when that starts."""
    status, observed, now, generation = plan.status, r.observed, r.now, r.generation
    if status.phase != api.RUNNING:
        return
    if observed.progress is not None:
        set_condition(status, "ProgressReported", True, "Scraped", "", now, generation)
        return
    since = observed.rank0_running_since
    if not observed.progress_error or not since:
        return
    left = PROGRESS_GRACE_SECONDS - (now - parse_timestamp(since)).total_seconds()
    if observed.progress_failing_since is not None:
        # One failed read is not enough: a rank 0 that has just finished its last step closes its
        # endpoint a few seconds before the pod ends, and that is no reason to say anything.
        left = max(left, PROGRESS_CONFIRM_SECONDS - (now - observed.progress_failing_since).total_seconds())
    if left > 0:  # too early to say; look again when the grace is over (no event may come by then)
        plan.requeue_after = left if plan.requeue_after is None else min(plan.requeue_after, left)
        return
    if observed.progress_unreachable:
        reason = "EndpointUnreachable"
        message = (f"rank 0's progress cannot be read: {observed.progress_error}; the operator must reach "
                   f"the trainer's metrics port (NetworkPolicy: the training's own admits the operator's "
                   f"pods and the chart's trainingNetworkPolicy.metricsFrom; a namespace's other policies "
                   f"may deny it, see the chart's networkPolicy.enabled)")
    else:
        reason = "ProgressRefused"
        message = (f"rank 0's progress was refused: {observed.progress_error}; its metrics endpoint must "
                   "serve the pets_* gauges as the trainer does (docs/contract.md)")
    was = next((c for c in status.conditions or [] if c["type"] == "ProgressReported"), None)
    set_condition(status, "ProgressReported", False, reason, message, now, generation)
    if not was or was.get("status") != "False":
        plan.events.append(Event("Warning", "ProgressUnreadable", message))


STALL_MIN_SECONDS = 120.0


STALL_STEPS = 20  # this many steps' time without progress


def stall_bound(r: Round, plan: Plan) -> float | None:
    """Seconds without progress after which a Running training is Stalled: spec.stallTimeoutSeconds,
    else 20 of its own steps (at least 2 minutes), once it has taken a step to measure."""
    status = plan.status
    if explicit := (r.spec.scheduling or {}).get("stallTimeoutSeconds"):
        return float(explicit)
    steps, elapsed = status.step, status.elapsed_seconds
    if not steps or not elapsed:
        return None
    return max(STALL_MIN_SECONDS, STALL_STEPS * float(elapsed) / float(steps))
