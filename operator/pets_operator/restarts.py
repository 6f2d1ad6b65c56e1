"""After a failure: the gang restart (spec.maxRestarts, disruptions the cluster caused not counted), the
permanent failure that ends a training at once, pods stuck on a lost node, and where the next attempt
resumes."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pets_contract import summary as summary_keys
from pets_operator import api, goodput, pods
from pets_operator.plan_types import Event, Plan, Round, Verdict, ref
from pets_operator.progress import summary_step
from pets_operator.timestamps import parse_timestamp, timestamp

BACKOFF_LIMIT = "BackoffLimitExceeded"  # the Job's reason once a pod's failure counted against it


def _failure_record(failure: pods.Failure, now: datetime) -> dict[str, Any]:
    record: dict[str, Any] = {
        "cause": failure.cause, "message": failure.message,
        "time": timestamp(parse_timestamp(failure.finished_at)) if failure.finished_at else timestamp(now),
    }
    for key, value in (("pod", failure.pod or None), ("rank", failure.rank), ("node", failure.node),
                       ("exitCode", failure.exit_code), ("logTail", failure.log_tail)):
        if value is not None:
            record[key] = value
    return record


def force_delete_lost(r: Round, plan: Plan) -> None:
    """Every pod stuck on a lost node is force-deleted (after the status write, see act.carry_out):
    no kubelet will confirm its end, and until it is gone its workload's deletion, and so the next
    attempt, waits for it."""
    observed = r.observed
    for pod in observed.lost_pods:
        meta = pod.get("metadata") or {}
        node = pods.node_of(pod)
        plan.force_delete.append({"name": str(meta.get("name")), "uid": str(meta.get("uid") or "")})
        plan.events.append(Event("Warning", "NodeLost", (
            f"node {node} stopped responding ({observed.lost_nodes.get(node, 'lost')}): force-deleting "
            f"pod {meta.get('name')}, which no kubelet will ever finish")))


def lost_current(r: Round) -> pods.Failure | None:
    """The current attempt's first pod on a lost node, as its failure (None: none is)."""
    observed = r.observed
    current = {(p.get("metadata") or {}).get("name") for p in observed.pods or []}
    lost = [p for p in observed.lost_pods if (p.get("metadata") or {}).get("name") in current]
    if not lost:
        return None
    pod = min(lost, key=lambda p: observed.backend.rank_of(p) or 0)
    return pods.lost_node_failure(pod, observed.lost_nodes.get(pods.node_of(pod), "lost"),
                                  observed.backend.rank_of)


def after_failure(r: Round, plan: Plan) -> Verdict:
    """The one restart rule: the cluster's failures restart the gang for free, the training's count,
    and an error the trainer calls permanent (or the workload's own failure policy) ends it at once.
    A pod on a lost node is the cluster's failure, and explains its peers' (they lost it)."""
    status, spec, observed, ws, restarts, now = plan.status, r.spec, r.observed, r.state, r.restarts, r.now
    assert observed.workload is not None and ws is not None
    trainer_error = (observed.summary or {}).get("error")
    failure = lost_current(r) or pods.first_failure(observed.pods or [], observed.backend.rank_of)
    disrupted = bool(observed.backend.disrupted_reason) and ws.reason == observed.backend.disrupted_reason
    if disrupted and failure is not None and (not failure.caused_by_cluster or failure.cause == "Stopped"):
        # The disrupted pod is gone (an eviction deletes it); its peers' exits only say they lost it, or
        # (exit 75) that they stopped with it, after the step checkpoint its SIGTERM asked for.
        failure = None
    if failure is None and not disrupted and ws.reason == BACKOFF_LIMIT and observed.pods is not None \
            and not observed.summary:
        # No failed pod or summary to show, and a rank without a pod: deleted (make chaos: a 1-replica
        # training's pod, whose trainer had stopped on SIGTERM, was gone when the operator looked)
        size = int(status.replicas or spec.replicas)
        failure = pods.vanished_failure(observed.pods, size, observed.backend.rank_of)
    detail = failure.message if failure else ws.message
    if trainer_error and failure is None:
        detail = f"{ws.message}; trainer: {trainer_error}"
    if failure is not None:
        status.last_failure = _failure_record(failure, now)
    disruptions = int(status.disruptions or 0)
    counted = restarts - disruptions
    permanent = (failure is not None and failure.permanent) or ws.reason == observed.backend.permanent_reason
    by_cluster = (failure is not None and failure.caused_by_cluster) or disrupted
    if failure is None and disrupted:  # the disrupted pod is gone; the Job's condition says what it was
        status.last_failure = {"cause": "Disrupted", "message": ws.message,
                                 "time": ws.completion_time or timestamp(now)}
    last_step = summary_step(observed.summary)  # how far it got: its summary's, exact
    if last_step is None:
        last_step = status.step  # as last read (no summary, or an older trainer's)
    if (failure is not None or disrupted) and isinstance(last_step, int) and status.last_failure:
        status.last_failure["lastStep"] = last_step  # lostSteps count from it
    if observed.summary:  # a stopped or failed trainer's own split of this attempt
        goodput.read_summary(status, int(status.attempt or 0), observed.rank0_running_since, observed.summary)
    if not permanent and (by_cluster or counted < spec.max_restarts):
        status.restarts = restarts + 1
        status.attempt = int(status.attempt or 0) + 1
        if by_cluster:
            status.disruptions = disruptions + 1
        plan.delete.append(ref(observed.workload))
        resume = resume_point(r, plan)
        cost = ("not counted: the cluster ended the pod" if by_cluster
                else f"{counted + 1}/{spec.max_restarts}")
        message = f"attempt {restarts} failed ({detail}); restarting the gang ({cost}), {resume}"
        plan.events.append(Event("Warning", "Restarting", message))
        plan.requeue_after = 0.0
        return api.RESTARTING, "GangRestart", message
    status.completion_time = ws.completion_time or timestamp(now)
    if permanent:
        return api.FAILED, "PermanentError", f"failed: {detail} (a restart cannot fix this)"
    if spec.max_restarts:
        return api.FAILED, "MaxRestartsExceeded", f"failed after {counted} counted restart(s): {detail}"
    return api.FAILED, ws.reason, f"failed: {detail}"


def resume_point(r: Round, plan: Plan) -> str:
    """Where the next attempt resumes, as a restart's message says it."""
    spec, status, summary = r.spec, plan.status, r.observed.summary or {}
    if "emptyDir" in api.output_of(spec):
        return "starting from epoch 0 (the output is an emptyDir, which goes with the pods)"
    step = summary_step(summary)
    if summary.get(summary_keys.STATUS) == summary_keys.STOPPED and step is not None:
        return f"resuming at step {step}, from the checkpoint it saved on SIGTERM"
    checkpoint = status.last_checkpoint or {}
    if checkpoint.get("step"):  # the trainer's newest, an epoch's or a step checkpoint
        return f"resuming from the newest checkpoint, at step {checkpoint['step']} or later"
    if checkpoint.get("epoch"):
        epoch, total, steps = checkpoint["epoch"], status.total_epochs, status.steps_total
        # Checkpoints are taken at epoch ends, and every epoch has the same number of steps.
        at_step = f", step {epoch * steps // total}" if total and steps and steps % total == 0 else ""
        return f"resuming from the checkpoint of epoch {epoch}{at_step}"
    return "resuming from the newest checkpoint"
