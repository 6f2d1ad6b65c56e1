"""Plans for a training whose workload cannot be made: an invalid spec, a backend not served, and a child
the API server refused (failed at once when a retry cannot help, else retried with a backoff bounded by
spec.scheduling.pendingTimeoutSeconds)."""

from __future__ import annotations

from typing import Any

from pets_operator import api
from pets_operator.conditions import apply_phase
from pets_operator.plan_types import Event, Plan, Round, ref, set_condition
from pets_operator.timestamps import parse_timestamp, timestamp

CHILD_RETRY_MIN_SECONDS = 2.0


CHILD_RETRY_MAX_SECONDS = 30.0


def unplannable(r: Round) -> Plan:
    """A spec the operator cannot act on (the API server let it through): Failed, with the reason. A spec
    naming a backend whose CRD is not served: Pending until it is (checked on every poll)."""
    if r.spec_error is not None:
        return _without_workload(r, api.FAILED, "InvalidSpec", r.spec_error)
    return _without_workload(r, api.PENDING, "BackendUnavailable", str(r.backend_error))


def _without_workload(r: Round, phase: str, reason: str, message: str) -> Plan:
    result = Plan(status=r.old.copy())
    result.status.observed_generation = r.generation
    result.verdict = (phase, reason, message)
    apply_phase(r, result)
    # One Warning per new reason, not one per poll (nor a second one for the phase change).
    result.events = [Event("Warning", reason, message)] if r.old.message != message else []
    return result


def child_refused(r: Round, plan: Plan) -> Plan:
    """The API server refused to create a child (`r.refused`); `plan` is the round's Plan it was made for.

    permanent (the request itself is wrong, see `cluster.child_refusal_permanent`): Failed, with the
    server's message, one Warning Event, and the children of this attempt that exist deleted (`_cleanup`):
    nothing is left behind and nothing is retried. Otherwise (a quota, rate limiting, a busy server):
    Pending (Restarting during a gang restart) with reason ChildCreateRetrying and the message, retried
    after a backoff that doubles with the time spent waiting (2 s up to 30 s, `requeue_after`). That wait
    counts as waiting for pods: it starts status.pendingSince, so spec.scheduling.pendingTimeoutSeconds
    bounds it as it bounds unschedulable pods.
    """
    assert r.refused is not None
    child, error, now = r.refused.child, r.refused.message, r.now
    old_since = r.old.pending_since
    waited = (now - parse_timestamp(old_since)).total_seconds() if old_since else 0.0
    timeout = (r.spec.scheduling or {}).get("pendingTimeoutSeconds")
    if r.refused.permanent or (timeout is not None and waited >= timeout):
        if r.refused.permanent:
            reason = "ChildRejected"
            message = (f"the API server refused {child}: {error} (a retry cannot fix this: fix the spec or "
                       "the policy, then recreate the PetsTraining)")
        else:
            reason = "PendingTimeout"
            message = f"did not start within spec.scheduling.pendingTimeoutSeconds={timeout}: could not " \
                      f"create {child}: {error}"
        result = _without_workload(r, api.FAILED, reason, message)
        result.status.pending_since = None
        result.status.completion_time = timestamp(now)
        result.delete = [ref(obj) for obj in _cleanup(r, plan)]
    else:
        phase = api.RESTARTING if r.old.phase == api.RESTARTING else api.PENDING
        message = f"waiting to create {child}: {error}; retrying"
        result = _without_workload(r, phase, "ChildCreateRetrying", message)
        result.status.pending_since = old_since or timestamp(now)
        delay = min(max(waited, CHILD_RETRY_MIN_SECONDS), CHILD_RETRY_MAX_SECONDS)
        result.requeue_after = delay if timeout is None else max(0.0, min(delay, timeout - waited))
    if result.status.workload_active is not None:
        result.status.workload_active = False  # its workload was not created
    if child.startswith("PersistentVolumeClaim "):  # the output claim: the work has nowhere durable to go
        set_condition(result.status, "OutputDurable", False, "ClaimRefused",
                      f"the API server refused the output claim {child.split(' ', 1)[1]}: {error}", now,
                      r.generation)
    return result


def _cleanup(r: Round, plan: Plan) -> list[dict[str, Any]]:
    """What a permanent refusal deletes: what this round made, our Service (maybe made by an earlier
    round; the planner checked it is ours), and what the Plan meant to delete anyway (older attempts'
    workloads). Not a claim it made: the operator may not delete claims; the training's owner reference
    takes it."""
    assert r.refused is not None
    made, refused_kind = r.refused.made, r.refused.child.split(" ", 1)[0]
    cleanup = [m for m in made if m["kind"] != "PersistentVolumeClaim"]
    service = (plan.status.children or {}).get("service")
    if service and not any(m["kind"] == "Service" for m in made) and refused_kind != "Service":
        cleanup.append({"apiVersion": "v1", "kind": "Service",
                        "metadata": {"name": service, "namespace": r.target.namespace}})
    return cleanup + [{"apiVersion": d["apiVersion"], "kind": d["kind"],
                       "metadata": {"name": d["name"], "namespace": d["namespace"]}} for d in plan.delete]
