"""Where a workload that has not ended stands: its state with its pods' word (every rank succeeded),
suspend and resume through the workload's own switch, and what its pods say (running, or waiting and
why, or refused by the API server), bounded by spec.scheduling.pendingTimeoutSeconds."""

from __future__ import annotations

from pets_operator import api, deadlines, pods
from pets_operator.backends import WorkloadState
from pets_operator.plan_types import Event, Plan, Round, Verdict, ref
from pets_operator.timestamps import parse_timestamp, timestamp


def state(r: Round, plan: Plan) -> WorkloadState | None:
    """The workload's state (None: there is none), Succeeded as soon as every rank's pod has: the
    workload's own Complete follows, as its controller catches up (a Succeeded pod is never undone, so
    the training's result cannot change)."""
    observed, replicas = r.observed, int(plan.status.replicas or 0)
    if observed.workload is None:
        return None
    ws = observed.state or observed.backend.state(observed.workload, replicas)
    if ws.phase in api.FINISHED_PHASES or not observed.pods:
        return ws
    finished = pods.all_ranks_succeeded(observed.pods, replicas, observed.backend.rank_of)
    if finished is None:
        return ws
    return WorkloadState(api.SUCCEEDED, "AllRanksSucceeded", f"all {replicas} ranks finished",
                         start_time=ws.start_time,
                         completion_time=timestamp(parse_timestamp(finished)) if finished else None)


def while_active(r: Round, plan: Plan) -> Verdict:
    """Not finished: suspend or resume, or say what the pods are doing."""
    status, spec, observed, ws = plan.status, r.spec, r.observed, r.state
    assert observed.workload is not None and ws is not None
    phase, reason, message = ws.phase, ws.reason, ws.message
    # Suspend / resume go through the workload's own suspend field.
    if observed.backend.is_suspended(observed.workload) != bool(spec.suspend):
        plan.suspend = bool(spec.suspend)
        plan.suspend_workload = observed.workload["metadata"]["name"]
        status.pending_since = None
        phase, reason, message = ((api.SUSPENDED, "Suspending", "suspending the training") if spec.suspend
                                  else (api.PENDING, "Resuming", "resuming the training"))
        plan.events.append(Event("Normal", "Suspended" if spec.suspend else "Resumed", message))
        return phase, reason, message
    # The workload's count says pods exist; only the pods say whether they run. With no pod visible
    # yet (just created), the workload's own view stands, unless the API server refused to create them.
    if phase != api.SUSPENDED and (observed.pods or observed.workload_refusals):
        phase, reason, message = _from_pods(r, plan)
    if phase in (api.SUSPENDED, api.RUNNING):  # not waiting
        status.pending_since = None
        return phase, reason, message
    if (timed_out := deadlines.pending_timed_out(r, plan)) is not None:
        plan.delete.append(ref(observed.workload))
        return api.FAILED, "PendingTimeout", f"{timed_out}: {message}"
    return (api.RESTARTING if r.restarts else api.PENDING), reason, message


def _from_pods(r: Round, plan: Plan) -> Verdict:
    observed = r.observed
    replicas = int(plan.status.replicas or r.spec.replicas)  # the size this attempt runs at
    pod_list = observed.pods or []
    running = pods.running_count(pod_list)
    if running >= replicas:
        return api.RUNNING, "PodsRunning", f"{running}/{replicas} pods running"
    waiting = pods.worst_waiting(pod_list, observed.pod_events)
    if len(pod_list) < replicas and (refused := pods.create_refused(observed.workload_refusals)) is not None:
        waiting = refused, replicas - len(pod_list)
    if waiting is None:
        return api.PENDING, "WaitingForPods", f"{running}/{replicas} pods running, waiting for the rest"
    why, count = waiting
    message = f"{count}/{replicas} pod(s) waiting: {why.message}"
    old_reason = next((c.get("reason") for c in plan.status.conditions or []
                       if c["type"] == "Progressing"), None)
    routine = ("FetchingDataset", "ContainerCreating", "WaitingForPods")  # said in status, no Warning
    if why.reason != old_reason and why.reason not in routine:
        plan.events.append(Event("Warning", why.reason, message))  # one per new reason, not per poll
    return api.PENDING, why.reason, message
