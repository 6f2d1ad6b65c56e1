"""A training queued by Kueue: Kueue alone suspends and admits its workload, the user's spec.suspend goes
through Kueue's Workload (spec.active), and Kueue's reasons (quota, preemption) are said in the status."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pets_operator import api
from pets_operator.plan_types import Event, Plan, Round, Verdict


def queue_name(r: Round) -> str:
    return r.target.queue_labels.get(api.KUEUE_QUEUE_LABEL, "")


def while_queued(r: Round, plan: Plan) -> Verdict | None:
    """A workload in a Kueue queue: Kueue alone flips its suspend (admission, preemption). The user's
    spec.suspend goes through Kueue's own switch, the Workload's spec.active; Kueue's reasons are
    mirrored into status in its own words. None: admitted, and from here on its pods tell."""
    spec, observed = r.spec, r.observed
    status = plan.status
    assert observed.workload is not None
    queue = queue_name(r)
    if not observed.queue_served:
        status.queue = QueueStatus(
            queue, False, "Kueue is not installed (workloads.kueue.x-k8s.io is not served)").to_dict()
        return (api.QUEUED, "QueueUnavailable",
                f"labelled {api.KUEUE_QUEUE_LABEL}={queue}, but Kueue is not installed in this cluster, so "
                f"nothing will admit the workload: install Kueue or remove the label")
    qw = observed.queue_workload
    conds = {c.get("type", ""): c for c in ((qw or {}).get("status") or {}).get("conditions") or []}
    admitted = conds.get("Admitted", {}).get("status") == "True"
    if qw is not None:
        wanted = not spec.suspend
        if bool((qw.get("spec") or {}).get("active", True)) != wanted:
            plan.queue_active, plan.queue_workload = wanted, qw["metadata"]["name"]
            plan.events.append(Event("Normal", "Resumed" if wanted else "Suspended",
                                       f"{'activating' if wanted else 'deactivating'} Kueue Workload "
                                       f"{qw['metadata']['name']}"))
    suspended = observed.backend.is_suspended(observed.workload)
    if spec.suspend:
        status.pending_since = None
        detail = "" if suspended else "; its pods stop once Kueue suspends the workload"
        message = (f"suspended: Kueue Workload {qw['metadata']['name']} is deactivated{detail}" if qw
                   else "suspended: Kueue's Workload is deactivated as soon as Kueue has made it")
        status.queue = QueueStatus.of(queue, qw, admitted, message).to_dict()
        return api.SUSPENDED, "Deactivated", message
    if not suspended:  # admitted: Kueue unsuspended it; from here on the pods tell
        status.queue = QueueStatus.of(queue, qw, True, "").to_dict()
        return None
    status.pending_since = None
    evicted = next((c for t in ("Evicted", "Preempted") if (c := conds.get(t, {})).get("status") == "True"
                    and c.get("reason") not in KUEUE_NOT_PREEMPTION), None)
    old_phase = plan.status.phase
    if evicted or old_phase in (api.RUNNING, api.PREEMPTED):
        why = evicted or {}
        message = (f"preempted by Kueue ({why.get('reason') or 'Evicted'}: "
                   f"{why.get('message') or 'suspended'}); it waits to be admitted again and then resumes "
                   "from its newest checkpoint (not a failure)")
        status.queue = QueueStatus.of(queue, qw, False, why.get("message") or "").to_dict()
        if old_phase != api.PREEMPTED:
            plan.events.append(Event("Warning", "Preempted", message))
        return api.PREEMPTED, why.get("reason") or "Preempted", message
    waiting = conds.get("QuotaReserved") or {}
    backend = observed.backend
    no_workload = (f"Kueue has made no Workload for the {backend.kind} yet (if this lasts: is Kueue's "
                   f"{backend.group}/{backend.name} integration enabled?)")
    kueue_says = waiting.get("message") or (no_workload if qw is None else "waiting for admission")
    message = f"queued in {queue}: {kueue_says}"
    status.queue = QueueStatus.of(queue, qw, False, kueue_says).to_dict()
    if old_phase != api.QUEUED:
        plan.events.append(Event("Normal", "Queued", message))
    return api.QUEUED, waiting.get("reason") or "WaitingForAdmission", message


def ran(r: Round, plan: Plan) -> None:
    """A queued training that succeeded ran, so Kueue admitted it (perhaps between two polls)."""
    if r.target.queued:
        workload = (plan.status.queue or {}).get("workload")
        plan.status.queue = QueueStatus(queue_name(r), True, "", workload).to_dict()


# Kueue's eviction reasons that are the user's doing, not a preemption: the Workload was deactivated
# (spec.suspend) and is being activated again.
KUEUE_NOT_PREEMPTION = ("InactiveWorkload", "Deactivated")


@dataclass(frozen=True)
class QueueStatus:
    """status.queue, typed: the LocalQueue, whether Kueue has admitted the workload, Kueue's words, and
    Kueue's Workload for this attempt (None: not made yet)."""

    name: str
    admitted: bool
    message: str
    workload: str | None = None

    @classmethod
    def of(cls, queue: str, qw: dict[str, Any] | None, admitted: bool, message: str) -> QueueStatus:
        return cls(queue, admitted, message, qw["metadata"]["name"] if qw is not None else None)

    def to_dict(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if value is not None}
