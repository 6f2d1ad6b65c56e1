"""Plans for a training whose workload cannot be made: an invalid spec, a backend not served, and a child
the API server refused (failed at once when a retry cannot help, else retried with a backoff bounded by
spec.scheduling.pendingTimeoutSeconds)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pets_operator import api
from pets_operator.backends import parse_timestamp, timestamp
from pets_operator.conditions import apply_phase
from pets_operator.plan_types import Event, Plan, ref, set_condition
from pets_operator.status_types import Status


def plan_invalid(body: dict[str, Any], error: str, now: datetime) -> Plan:
    """A spec the operator cannot act on (the API server let it through): Failed, with the reason."""
    return plan_without_workload(body, api.FAILED, "InvalidSpec", error, now)


def plan_backend_unavailable(body: dict[str, Any], error: str, now: datetime) -> Plan:
    """The spec names a backend whose CRD is not served: Pending until it is (checked on every poll)."""
    return plan_without_workload(body, api.PENDING, "BackendUnavailable", error, now)


def plan_without_workload(body: dict[str, Any], phase: str, reason: str, message: str,
                           now: datetime) -> Plan:
    old = Status.from_dict(body.get("status") or {})
    generation = (body.get("metadata") or {}).get("generation")
    result = Plan(status=old.copy())
    result.status.observed_generation = generation
    apply_phase(result, old.phase, phase, reason, message, now, generation)
    # One Warning per new reason, not one per poll (nor a second one for the phase change).
    result.events = [Event("Warning", reason, message)] if old.message != message else []
    return result


CHILD_RETRY_MIN_SECONDS = 2.0


CHILD_RETRY_MAX_SECONDS = 30.0


def plan_child_refused(body: dict[str, Any], error: str, now: datetime, permanent: bool, *,
                       child: str = "a child", cleanup: list[dict[str, Any]] | None = None) -> Plan:
    """The API server refused to create a child (`child`: "Job pets-r0"); `error` is its own message.

    permanent (the request itself is wrong, see `cluster.child_refusal_permanent`): Failed, with the
    server's message, one Warning Event, and `cleanup` (the children of this attempt that exist) deleted:
    nothing is left behind and nothing is retried. Otherwise (a quota, rate limiting, a busy server):
    Pending (Restarting during a gang restart) with reason ChildCreateRetrying and the message, retried
    after a backoff that doubles with the time spent waiting (2 s up to 30 s, `requeue_after`). That wait
    counts as waiting for pods: it starts status.pendingSince, so spec.scheduling.pendingTimeoutSeconds
    bounds it as it bounds unschedulable pods.
    """
    old = Status.from_dict(body.get("status") or {})
    old_since = old.pending_since
    waited = (now - parse_timestamp(old_since)).total_seconds() if old_since else 0.0
    timeout = (((body.get("spec") or {}).get("scheduling")) or {}).get("pendingTimeoutSeconds")
    if permanent or (timeout is not None and waited >= timeout):
        if permanent:
            reason = "ChildRejected"
            message = (f"the API server refused {child}: {error} (a retry cannot fix this: fix the spec or "
                       "the policy, then recreate the PetsTraining)")
        else:
            reason = "PendingTimeout"
            message = f"did not start within spec.scheduling.pendingTimeoutSeconds={timeout}: could not " \
                      f"create {child}: {error}"
        result = plan_without_workload(body, api.FAILED, reason, message, now)
        result.status.pending_since = None
        result.status.completion_time = timestamp(now)
        result.delete = [ref(obj) for obj in cleanup or []]
    else:
        phase = api.RESTARTING if old.phase == api.RESTARTING else api.PENDING
        message = f"waiting to create {child}: {error}; retrying"
        result = plan_without_workload(body, phase, "ChildCreateRetrying", message, now)
        result.status.pending_since = old_since or timestamp(now)
        delay = min(max(waited, CHILD_RETRY_MIN_SECONDS), CHILD_RETRY_MAX_SECONDS)
        result.requeue_after = delay if timeout is None else max(0.0, min(delay, timeout - waited))
    if result.status.workload_active is not None:
        result.status.workload_active = False  # its workload was not created
    if child.startswith("PersistentVolumeClaim "):  # the output claim: the work has nowhere durable to go
        set_condition(result.status, "OutputDurable", False, "ClaimRefused",
                       f"the API server refused the output claim {child.split(' ', 1)[1]}: {error}", now,
                       (body.get("metadata") or {}).get("generation"))
    return result
