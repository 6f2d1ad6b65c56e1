"""When a training is looked at again, and how often its status is written: a Plan that only rewrites the
status within a phase is held back, and every Plan says when the next round is due at the latest."""

from __future__ import annotations

from pets_operator import api, backends
from pets_operator.plan_types import Plan, Round

POLL_IDLE = 30.0  # waiting for something that is not watched: a backend's CRD, Kueue's Workload
RESYNC = 600.0  # a training whose children are all watched: a safety net, read from the indices
STATUS_WRITE_INTERVAL = 10.0  # seconds between two status writes of a training within one phase


def pace(r: Round, plan: Plan) -> None:
    """Whether the Plan waits (plan.hold) and when the next round is due (plan.next_round)."""
    wait = None if r.refused is not None else _held_back(r, plan)  # a refusal's status is written now
    plan.hold = wait is not None
    delay = wait if wait is not None else _next_delay(r, plan)
    if r.backend_error is not None:  # the CRD may be installed later: look again
        delay = POLL_IDLE if delay is None else min(delay, POLL_IDLE)
    if delay is not None and r.observed.stuck_pods:  # a pod stuck terminating: is its node lost by now?
        delay = min(delay, r.progress_interval)
    plan.next_round = delay


def _held_back(r: Round, plan: Plan) -> float | None:
    """Seconds to hold back a Plan that only rewrites the status within the same phase (counts, a
    message, a waiting reason), when this training's status was written less than STATUS_WRITE_INTERVAL
    ago; None: act now. A training's pods starting or ending make a burst of such changes, each a write
    of the whole PetsTraining; at 1000 trainings they were most of the API server's work (docs/scale.md).
    A phase change and any Plan that creates, deletes or switches something is never held back."""
    if plan.status.to_dict() == r.stored or plan.status.phase != r.stored.get("phase") or \
            plan.create or plan.delete or plan.force_delete or plan.delete_self or \
            plan.suspend is not None or plan.queue_active is not None:
        return None
    since = r.written_ago
    return STATUS_WRITE_INTERVAL - since if since < STATUS_WRITE_INTERVAL else None


def _next_delay(r: Round, plan: Plan) -> float | None:
    """Seconds until the next round at the latest (None: only an event or the Plan's own deadline).

    Changes to a watched workload (a Job), its pods and Service wake the training at once, so it needs
    no poll but a slow resync; a workload that is not watched (a PyTorchJob) is polled while it runs.
    Sooner when the Plan asks (a TTL, a pending timeout, a stall bound, a refused child's backoff)."""
    if plan.delete_self:
        return None
    if r.refused is not None and plan.requeue_after is not None:
        return max(0.5, plan.requeue_after)  # the refusal's own backoff
    phase, poll_active = plan.status.phase, r.progress_interval
    watched = r.observed.backend is backends.JOB
    delay: float | None
    if phase in api.FINISHED_PHASES:
        delay = None
    elif phase == api.PENDING and plan.status.pending_since:
        delay = poll_active  # its pods wait: mount failures are only in Events, which are not watched
    elif phase == api.RESTARTING or plan.create or plan.delete or plan.force_delete:
        delay = 1.0  # a fallback: the deletions it waits for are watched
    elif phase == api.RUNNING:
        delay = RESYNC if watched else poll_active
    elif phase in (api.PENDING, api.SUSPENDED):
        delay = RESYNC if watched else POLL_IDLE
    else:
        delay = POLL_IDLE  # Queued (Kueue's Workload is not watched), Suspended, waiting for a CRD
    if plan.requeue_after is not None:
        delay = plan.requeue_after if delay is None else min(delay, plan.requeue_after)
    return None if delay is None else max(0.5, delay)
