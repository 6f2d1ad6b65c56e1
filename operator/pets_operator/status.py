"""Pure lifecycle logic: (spec, old status, observed children, progress) -> a Plan.

A Plan says what status to write, which Kubernetes objects to create or delete, and which Events
to emit. `handlers.py` observes the cluster, calls `plan()`, and carries the Plan out; it decides
nothing itself. Everything here is deterministic given its inputs (time is passed in).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pets_operator import api, builders
from pets_operator.backends import Backend, WorkloadState, parse_timestamp, timestamp


@dataclass(frozen=True)
class Observed:
    """What the operator saw in the cluster for one PetsTraining."""

    backend: Backend  # already resolved
    workload: dict[str, Any] | None  # the current attempt's workload
    stale: list[dict[str, Any]] = field(default_factory=list)  # workloads of older attempts
    service: dict[str, Any] | None = None  # the headless Service (backends that use one)
    progress: dict[str, float] | None = None  # rank 0's gauges, parsed (see progress.py)
    summary: dict[str, Any] | None = None  # rank 0's termination message, parsed
    state: WorkloadState | None = None  # `backend.state(workload)`, read once by the observer

    def workload_state(self, replicas: int) -> WorkloadState | None:
        if self.workload is None:
            return None
        return self.state or self.backend.state(self.workload, replicas)


@dataclass
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Plan:
    status: dict[str, Any]
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[dict[str, Any]] = field(default_factory=list)  # objects (kind/name/namespace)
    suspend: bool | None = None  # set the workload's suspend to this
    suspend_workload: str | None = None  # the workload whose suspend to set
    events: list[Event] = field(default_factory=list)
    delete_self: bool = False  # TTL after finish expired
    requeue_after: float | None = None  # seconds until the plan should be made again at the latest


def parse_summary(message: str | None) -> dict[str, Any] | None:
    """The trainer's termination message (docs/contract.md) -> summary dict, or None if not JSON."""
    if not message:
        return None
    try:
        value = json.loads(message)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _set_condition(conditions: list[dict[str, Any]], ctype: str, status: bool, reason: str,
                   message: str, now: datetime, generation: int | None) -> None:
    value = "True" if status else "False"
    for cond in conditions:
        if cond["type"] == ctype:
            if cond.get("status") != value:
                cond["lastTransitionTime"] = timestamp(now)
            cond.update(status=value, reason=reason, message=message)
            if generation is not None:
                cond["observedGeneration"] = generation
            return
    new: dict[str, Any] = {"type": ctype, "status": value, "reason": reason, "message": message,
           "lastTransitionTime": timestamp(now)}
    if generation is not None:
        new["observedGeneration"] = generation
    conditions.append(new)


def _ref(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "name": meta.get("name"),
            "namespace": meta.get("namespace")}


PROGRESS_FIELDS = {
    "pets_epoch": ("epoch", int),
    "pets_total_epochs": ("totalEpochs", int),
    "pets_train_loss": ("trainLoss", float),
    "pets_eval_accuracy": ("evalAccuracy", float),
    "pets_images_per_second": ("imagesPerSecond", float),
    "pets_elapsed_seconds": ("elapsedSeconds", float),
    "pets_eta_seconds": ("etaSeconds", float),
}


def _mirror_progress(status: dict[str, Any], progress: dict[str, float], now: datetime) -> None:
    changed = False
    for metric, (key, kind) in PROGRESS_FIELDS.items():
        if metric in progress:
            value = kind(round(progress[metric], 6))
            changed |= status.get(key) != value
            status[key] = value
    if "epoch" in status and "totalEpochs" in status:
        status["progress"] = f"{status['epoch']}/{status['totalEpochs']}"
    if changed:  # an unchanged scrape writes nothing, so an idle poll costs no API write
        status["lastProgressTime"] = timestamp(now)


def _mirror_summary(status: dict[str, Any], summary: dict[str, Any], total_epochs: int) -> None:
    status["summary"] = summary
    if isinstance(summary.get("final_accuracy"), int | float):
        status["evalAccuracy"] = float(summary["final_accuracy"])
    if isinstance(summary.get("final_train_loss"), int | float):
        status["trainLoss"] = float(summary["final_train_loss"])
    if isinstance(summary.get("images_per_second"), int | float):
        status["imagesPerSecond"] = float(summary["images_per_second"])
    if isinstance(summary.get("epochs"), int):
        status["epoch"] = summary["epochs"]
        status["totalEpochs"] = total_epochs
        status["progress"] = f"{summary['epochs']}/{total_epochs}"
    status["etaSeconds"] = 0.0


def plan(
    body: dict[str, Any],
    spec: dict[str, Any],
    observed: Observed,
    target: builders.Target,
    now: datetime,
) -> Plan:
    """Decide the next step for one PetsTraining. `target.attempt` must be status.restarts."""
    meta = body.get("metadata") or {}
    old = dict(body.get("status") or {})
    status: dict[str, Any] = json.loads(json.dumps(old))  # deep copy, JSON-only
    status.setdefault("conditions", [])
    generation = meta.get("generation")
    restarts = int(old.get("restarts") or 0)
    backend = observed.backend
    result = Plan(status=status)
    old_phase = old.get("phase")

    status["observedGeneration"] = generation
    status["backend"] = backend.name
    status["replicas"] = spec["replicas"]
    status["restarts"] = restarts
    status.setdefault("totalEpochs", spec["epochs"])
    status["children"] = backend.children_names(target.name, restarts)

    # Older attempts' workloads are always cleaned up (a restart deletes, then recreates).
    result.delete += [_ref(w) for w in observed.stale]

    if old_phase in api.FINISHED_PHASES:
        # Terminal: nothing is created again. Only the TTL remains.
        _ttl(result, spec, status, now)
        return result

    service = backend.build_service(spec, target)
    if service is not None and observed.service is None:
        result.create.append(service)
    ws = observed.workload_state(spec["replicas"])
    if observed.workload is None or ws is None:
        if observed.stale:
            phase, reason, message = api.RESTARTING, "WaitingForOldAttempt", \
                "waiting for the previous attempt's workload to go away"
        else:
            workload = backend.build_workload(spec, target)
            result.create.append(workload)
            phase = api.SUSPENDED if spec["suspend"] else (api.RESTARTING if restarts else api.PENDING)
            reason = "Created"
            message = f"created {workload['kind']} {workload['metadata']['name']}"
            result.events.append(Event("Normal", "Created", message))
        status["activeReplicas"] = 0
        status["readyReplicas"] = 0
        _apply_phase(result, old_phase, phase, reason, message, now, generation)
        return result

    status["activeReplicas"] = ws.active
    status["readyReplicas"] = ws.ready
    if ws.start_time and not status.get("startTime"):
        status["startTime"] = ws.start_time
    if observed.progress:
        _mirror_progress(status, observed.progress, now)

    phase, reason, message = ws.phase, ws.reason, ws.message
    if phase == api.SUCCEEDED:
        status["completionTime"] = ws.completion_time or timestamp(now)
        if observed.summary:
            _mirror_summary(status, observed.summary, spec["epochs"])
        acc = status.get("evalAccuracy")
        message = "training finished" + (f": accuracy {acc:.4f}" if isinstance(acc, float) else "")
    elif phase == api.FAILED:
        detail = message
        if observed.summary and observed.summary.get("error"):
            detail = f"{message}; trainer: {observed.summary['error']}"
        if restarts < spec["maxRestarts"]:
            status["restarts"] = restarts + 1
            result.delete.append(_ref(observed.workload))
            phase, reason = api.RESTARTING, "GangRestart"
            message = (f"attempt {restarts} failed ({detail}); restarting the gang "
                       f"({restarts + 1}/{spec['maxRestarts']}), resuming from the newest checkpoint")
            result.events.append(Event("Warning", "Restarting", message))
            result.requeue_after = 0.0
        else:
            status["completionTime"] = ws.completion_time or timestamp(now)
            reason = "MaxRestartsExceeded" if spec["maxRestarts"] else ws.reason
            message = (f"failed after {restarts} restart(s): {detail}" if spec["maxRestarts"]
                       else f"failed: {detail}")
    else:
        # Suspend / resume go through the workload's own suspend field.
        if backend.is_suspended(observed.workload) != bool(spec["suspend"]):
            result.suspend = bool(spec["suspend"])
            result.suspend_workload = observed.workload["metadata"]["name"]
            if spec["suspend"]:
                phase, reason, message = api.SUSPENDED, "Suspending", "suspending the training"
            else:
                phase, reason, message = api.PENDING, "Resuming", "resuming the training"
            result.events.append(Event("Normal", "Suspended" if spec["suspend"] else "Resumed", message))
        elif restarts and phase == api.PENDING:
            phase = api.RESTARTING
    _apply_phase(result, old_phase, phase, reason, message, now, generation)
    if phase in api.FINISHED_PHASES:
        _ttl(result, spec, status, now)
    return result


def plan_invalid(body: dict[str, Any], error: str, now: datetime) -> Plan:
    """A spec the operator cannot act on (the API server let it through): Failed, with the reason."""
    return _plan_without_workload(body, api.FAILED, "InvalidSpec", error, now)


def plan_backend_unavailable(body: dict[str, Any], error: str, now: datetime) -> Plan:
    """The spec names a backend whose CRD is not served: Pending until it is (checked on every poll)."""
    return _plan_without_workload(body, api.PENDING, "BackendUnavailable", error, now)


def _plan_without_workload(body: dict[str, Any], phase: str, reason: str, message: str,
                           now: datetime) -> Plan:
    old = dict(body.get("status") or {})
    status: dict[str, Any] = json.loads(json.dumps(old))
    status.setdefault("conditions", [])
    generation = (body.get("metadata") or {}).get("generation")
    status["observedGeneration"] = generation
    result = Plan(status=status)
    _apply_phase(result, old.get("phase"), phase, reason, message, now, generation)
    # One Warning per new reason, not one per poll (nor a second one for the phase change).
    result.events = [Event("Warning", reason, message)] if old.get("message") != message else []
    return result


def _apply_phase(result: Plan, old_phase: str | None, phase: str, reason: str, message: str,
                 now: datetime, generation: int | None) -> None:
    status = result.status
    conditions = status["conditions"]
    status["phase"] = phase
    status["message"] = message
    active = phase in (api.PENDING, api.RUNNING, api.RESTARTING)
    _set_condition(conditions, "Progressing", active, reason if active else phase, message, now, generation)
    _set_condition(conditions, "Ready", phase == api.RUNNING, reason, message, now, generation)
    _set_condition(conditions, "Suspended", phase == api.SUSPENDED, reason if phase == api.SUSPENDED
                   else "NotSuspended", message if phase == api.SUSPENDED else "", now, generation)
    _set_condition(conditions, "Succeeded", phase == api.SUCCEEDED, reason if phase == api.SUCCEEDED
                   else "NotSucceeded", message if phase == api.SUCCEEDED else "", now, generation)
    _set_condition(conditions, "Failed", phase == api.FAILED, reason if phase == api.FAILED
                   else "NotFailed", message if phase == api.FAILED else "", now, generation)
    if phase != old_phase:
        if phase in (api.RUNNING, api.SUCCEEDED):
            result.events.append(Event("Normal", phase, message))
        elif phase == api.FAILED:
            result.events.append(Event("Warning", phase, message))
    if phase == api.RUNNING and not status.get("startTime"):
        status["startTime"] = timestamp(now)


def _ttl(result: Plan, spec: dict[str, Any], status: dict[str, Any], now: datetime) -> None:
    ttl = spec.get("ttlSecondsAfterFinished")
    done = status.get("completionTime")
    if ttl is None or not done:
        return
    left = (parse_timestamp(done) - now).total_seconds() + ttl
    if left <= 0:
        result.delete_self = True
    else:
        result.requeue_after = left
