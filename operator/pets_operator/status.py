"""Pure lifecycle logic: (spec, old status, observed children, progress) -> a Plan.

A Plan says what status to write, which Kubernetes objects to create or delete, and which Events
to emit. `handlers.py` observes the cluster, calls `plan()`, and carries the Plan out; it decides
nothing itself. Everything here is deterministic given its inputs (time is passed in).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pets_operator import api, builders


@dataclass(frozen=True)
class Observed:
    """What the operator saw in the cluster for one PetsTraining."""

    backend: str  # job | pytorchjob (already resolved)
    workload: dict[str, Any] | None  # the current attempt's Job or PyTorchJob
    stale: list[dict[str, Any]] = field(default_factory=list)  # workloads of older attempts
    service: dict[str, Any] | None = None  # the headless Service (job backend)
    progress: dict[str, float] | None = None  # rank 0's gauges, parsed (see progress.py)
    summary: dict[str, Any] | None = None  # rank 0's termination message, parsed


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
    events: list[Event] = field(default_factory=list)
    delete_self: bool = False  # TTL after finish expired
    requeue_after: float | None = None  # seconds until the plan should be made again at the latest


def _ts(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_ts(text: str) -> datetime:
    """RFC 3339 as the API server writes it ('...Z') or as the client serialises it ('...+00:00')."""
    value = datetime.fromisoformat(text)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _norm_ts(text: Any) -> str | None:
    """A timestamp from a child's status, written back in the API server's own form (UTC, 'Z')."""
    if not text:
        return None
    return _ts(_parse_ts(str(text)).astimezone(UTC))


def _conditions(workload: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    if not workload:
        return {}
    return {c.get("type", ""): c for c in (workload.get("status") or {}).get("conditions") or []
            if c.get("status") == "True"}


@dataclass(frozen=True)
class WorkloadState:
    phase: str  # one of api.PHASES (never Restarting: that is the operator's decision)
    reason: str
    message: str
    active: int = 0
    ready: int = 0
    start_time: str | None = None
    completion_time: str | None = None


def job_state(job: dict[str, Any], replicas: int) -> WorkloadState:
    """An Indexed Job's status -> the phase it implies."""
    conds = _conditions(job)
    st = job.get("status") or {}
    active, ready = int(st.get("active") or 0), int(st.get("ready") or 0)
    start, done = _norm_ts(st.get("startTime")), _norm_ts(st.get("completionTime"))
    if "Complete" in conds or "SuccessCriteriaMet" in conds:
        c = conds.get("Complete") or conds["SuccessCriteriaMet"]
        return WorkloadState(api.SUCCEEDED, "JobComplete", c.get("message") or
                             f"all {replicas} ranks finished", active, ready, start, done)
    if "Failed" in conds or "FailureTarget" in conds:
        c = conds.get("Failed") or conds["FailureTarget"]
        reason = c.get("reason") or "JobFailed"
        return WorkloadState(api.FAILED, reason, c.get("message") or f"Job failed ({reason})",
                             active, ready, start, _norm_ts(c.get("lastTransitionTime")))
    if (job.get("spec") or {}).get("suspend") or "Suspended" in conds:
        return WorkloadState(api.SUSPENDED, "JobSuspended", "the Job is suspended", active, ready, start)
    if active > 0:
        return WorkloadState(api.RUNNING, "PodsRunning", f"{ready}/{replicas} pods ready, {active} active",
                             active, ready, start)
    return WorkloadState(api.PENDING, "WaitingForPods", "waiting for the Job's pods", active, ready, start)


def pytorchjob_state(pj: dict[str, Any], replicas: int) -> WorkloadState:
    """A PyTorchJob's status -> the phase it implies."""
    conds = _conditions(pj)
    st = pj.get("status") or {}
    rstat = st.get("replicaStatuses") or {}
    active = sum(int((v or {}).get("active") or 0) for v in rstat.values())
    start, done = _norm_ts(st.get("startTime")), _norm_ts(st.get("completionTime"))
    if "Succeeded" in conds:
        return WorkloadState(api.SUCCEEDED, "PyTorchJobSucceeded", conds["Succeeded"].get("message") or
                             "PyTorchJob succeeded", active, active, start, done)
    if "Failed" in conds:
        c = conds["Failed"]
        return WorkloadState(api.FAILED, c.get("reason") or "PyTorchJobFailed",
                             c.get("message") or "PyTorchJob failed", active, active, start,
                             done or _norm_ts(c.get("lastTransitionTime")))
    if "Suspended" in conds or ((pj.get("spec") or {}).get("runPolicy") or {}).get("suspend"):
        return WorkloadState(api.SUSPENDED, "PyTorchJobSuspended", "the PyTorchJob is suspended",
                             active, active, start)
    if "Running" in conds or active > 0:
        return WorkloadState(api.RUNNING, "PodsRunning", f"{active}/{replicas} pods active",
                             active, active, start)
    return WorkloadState(api.PENDING, "WaitingForPods", "waiting for the PyTorchJob's pods", active,
                         active, start)


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
                cond["lastTransitionTime"] = _ts(now)
            cond.update(status=value, reason=reason, message=message)
            if generation is not None:
                cond["observedGeneration"] = generation
            return
    new: dict[str, Any] = {"type": ctype, "status": value, "reason": reason, "message": message,
           "lastTransitionTime": _ts(now)}
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
        status["lastProgressTime"] = _ts(now)


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
    """Decide the next step for one PetsTraining. `target.attempt` is ignored: it comes from status."""
    meta = body.get("metadata") or {}
    old = dict(body.get("status") or {})
    status: dict[str, Any] = json.loads(json.dumps(old))  # deep copy, JSON-only
    status.setdefault("conditions", [])
    generation = meta.get("generation")
    restarts = int(old.get("restarts") or 0)
    attempt_target = builders.Target(target.name, target.namespace, restarts, target.default_image,
                                     target.cluster_domain)
    result = Plan(status=status)
    old_phase = old.get("phase")

    status["observedGeneration"] = generation
    status["backend"] = observed.backend
    status["replicas"] = spec["replicas"]
    status["restarts"] = restarts
    status.setdefault("totalEpochs", spec["epochs"])
    children: dict[str, Any] = {}
    if observed.backend == "job":
        children = {"service": builders.service_name(target.name),
                    "job": builders.job_name(target.name, restarts)}
    else:
        children = {"pytorchJob": builders.job_name(target.name, restarts)}
    status["children"] = children

    # Older attempts' workloads are always cleaned up (a restart deletes, then recreates).
    result.delete += [_ref(w) for w in observed.stale]

    if old_phase in api.FINISHED_PHASES:
        # Terminal: nothing is created again. Only the TTL remains.
        _ttl(result, spec, status, now)
        return result

    desired = builders.build_children(spec, attempt_target, observed.backend)
    if observed.backend == "job" and observed.service is None:
        result.create.append(desired[0])
    if observed.workload is None:
        if observed.stale:
            phase, reason, message = api.RESTARTING, "WaitingForOldAttempt", \
                "waiting for the previous attempt's workload to go away"
        else:
            result.create.append(desired[-1])
            phase = api.SUSPENDED if spec["suspend"] else (api.RESTARTING if restarts else api.PENDING)
            reason = "Created"
            message = f"created {desired[-1]['kind']} {desired[-1]['metadata']['name']}"
            result.events.append(Event("Normal", "Created", message))
        status["activeReplicas"] = 0
        status["readyReplicas"] = 0
        _apply_phase(result, old_phase, phase, reason, message, spec, now, generation)
        return result

    ws = (job_state if observed.backend == "job" else pytorchjob_state)(observed.workload, spec["replicas"])
    status["activeReplicas"] = ws.active
    status["readyReplicas"] = ws.ready
    if ws.start_time and not status.get("startTime"):
        status["startTime"] = ws.start_time
    if observed.progress:
        _mirror_progress(status, observed.progress, now)

    phase, reason, message = ws.phase, ws.reason, ws.message
    if phase == api.SUCCEEDED:
        status["completionTime"] = ws.completion_time or _ts(now)
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
            status["completionTime"] = ws.completion_time or _ts(now)
            reason = "MaxRestartsExceeded" if spec["maxRestarts"] else ws.reason
            message = (f"failed after {restarts} restart(s): {detail}" if spec["maxRestarts"]
                       else f"failed: {detail}")
    else:
        # Suspend / resume go through the workload's own suspend field.
        suspended_now = bool(_workload_suspend(observed.backend, observed.workload))
        if suspended_now != bool(spec["suspend"]):
            result.suspend = bool(spec["suspend"])
            if spec["suspend"]:
                phase, reason, message = api.SUSPENDED, "Suspending", "suspending the training"
            else:
                phase, reason, message = api.PENDING, "Resuming", "resuming the training"
            result.events.append(Event("Normal", "Suspended" if spec["suspend"] else "Resumed", message))
        elif restarts and phase == api.PENDING:
            phase = api.RESTARTING
    _apply_phase(result, old_phase, phase, reason, message, spec, now, generation)
    if phase in api.FINISHED_PHASES:
        _ttl(result, spec, status, now)
    return result


def _workload_suspend(backend: str, workload: dict[str, Any]) -> bool:
    spec = workload.get("spec") or {}
    if backend == "job":
        return bool(spec.get("suspend"))
    return bool((spec.get("runPolicy") or {}).get("suspend"))


def _apply_phase(result: Plan, old_phase: str | None, phase: str, reason: str, message: str,
                 spec: dict[str, Any], now: datetime, generation: int | None) -> None:
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
        status["startTime"] = _ts(now)


def _ttl(result: Plan, spec: dict[str, Any], status: dict[str, Any], now: datetime) -> None:
    ttl = spec.get("ttlSecondsAfterFinished")
    done = status.get("completionTime")
    if ttl is None or not done:
        return
    left = (_parse_ts(done) - now).total_seconds() + ttl
    if left <= 0:
        result.delete_self = True
    else:
        result.requeue_after = left
