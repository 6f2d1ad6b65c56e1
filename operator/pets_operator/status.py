"""Pure lifecycle logic: (spec, old status, observed children, progress) -> a Plan.

A Plan says what status to write, which Kubernetes objects to create or delete, and which Events
to emit. `handlers.py` observes the cluster, calls `plan()`, and carries the Plan out; it decides
nothing itself. Everything here is deterministic given its inputs (time is passed in).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pets_operator import api, builders, goodput, pods
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
    pods: list[dict[str, Any]] | None = None  # the current attempt's pods (None: not observed)
    pod_events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # Warning Events by pod
    # The workload's FailedCreate Events (read only while some of its pods do not exist)
    workload_refusals: list[dict[str, Any]] = field(default_factory=list)
    progress_error: str | None = None  # why rank 0's progress endpoint could not be read
    progress_failing_since: datetime | None = None  # since when (None: taken as confirmed)
    rank0_running_since: str | None = None  # when rank 0's trainer container started
    queue_workload: dict[str, Any] | None = None  # Kueue's Workload for the current workload (queued ones)
    queue_served: bool = True  # whether Kueue's Workload API is served at all
    backend_reason: str = ""  # why that backend (backends.why)
    # Why the output, where spec.output is unset (OUTPUT_REASONS; "": the spec says)
    output_reason: str = ""
    output_claim: dict[str, Any] | None = None  # the output claim, read while a pod waits to be scheduled
    # Pods of this training (the current workload's, or a deleting older one's) stuck on a lost node
    # (`pods.terminating_unfinished` on a node `pods.node_lost` calls lost), and why each node is lost.
    lost_pods: list[dict[str, Any]] = field(default_factory=list)
    lost_nodes: dict[str, str] = field(default_factory=dict)

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
    force_delete: list[dict[str, str]] = field(default_factory=list)  # pods (name, uid) on lost nodes
    suspend: bool | None = None  # set the workload's suspend to this
    suspend_workload: str | None = None  # the workload whose suspend to set
    queue_active: bool | None = None  # set Kueue's Workload spec.active to this (queued trainings)
    queue_workload: str | None = None  # the Kueue Workload to set it on
    events: list[Event] = field(default_factory=list)
    delete_self: bool = False  # TTL after finish expired
    requeue_after: float | None = None  # seconds until the plan should be made again at the latest


def _set_condition(conditions: list[dict[str, Any]], ctype: str, status: bool | None, reason: str,
                   message: str, now: datetime, generation: int | None) -> None:
    value = "Unknown" if status is None else "True" if status else "False"
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


def merge_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns the stored status `old` into the planned `new`: a key
    `new` lacks is null, so a key the plan removed (status.pop) is removed from the stored status too,
    which a patch of `new` itself would keep. Written here rather than taken from a library: ten lines,
    and no package of ours has it."""
    patch: dict[str, Any] = {key: None for key in old.keys() - new.keys()}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            if inner := merge_patch(before, value):
                patch[key] = inner
        elif key not in old or value != before:
            patch[key] = value
    return patch


def _network_policy(result: Plan, spec: dict[str, Any], target: builders.Target, made: str | None, *,
                    started_without: bool) -> dict[str, Any] | None:
    """The training's NetworkPolicy, if it is to have one. It is made once, with the first workload and
    before it (plan's creating branch), and then named in status.children; a training that an operator
    without policies started (its status names children, but no policy) gets it in this round. The one
    the operator made is deleted when spec.networkPolicy or the chart's switch turns it off. No watch is
    needed: the policy is owned by the training, and a create of an existing one is a no-op."""
    policy = builders.build_network_policy(spec, target)
    if policy is not None:
        if not made and started_without:  # (a made one is already named: plan carries it over)
            result.create.append(policy)
            result.status["children"]["networkPolicy"] = policy["metadata"]["name"]
    elif made:
        result.delete.append({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "name": made,
                              "namespace": target.namespace})
        result.status["children"].pop("networkPolicy", None)
    return policy


def _ref(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "name": meta.get("name"),
            "namespace": meta.get("namespace")}


# metric -> (status field, type, top): a scraped value outside 0..top is refused (progress.check_progress);
# 2**53 keeps an integer exact as a JSON number, an accuracy is a fraction.
PROGRESS_TOP = 2**53
PROGRESS_FIELDS = {
    "pets_epoch": ("epoch", int, PROGRESS_TOP),
    "pets_total_epochs": ("totalEpochs", int, PROGRESS_TOP),
    "pets_train_loss": ("trainLoss", float, PROGRESS_TOP),
    "pets_eval_accuracy": ("evalAccuracy", float, 1),
    "pets_images_per_second": ("imagesPerSecond", float, PROGRESS_TOP),
    "pets_elapsed_seconds": ("elapsedSeconds", float, PROGRESS_TOP),
    "pets_eta_seconds": ("etaSeconds", float, PROGRESS_TOP),
    "pets_step": ("step", int, PROGRESS_TOP),
    "pets_steps_total": ("stepsTotal", int, PROGRESS_TOP),
    "pets_checkpoint_epoch": ("lastCheckpoint", int, PROGRESS_TOP),  # becomes lastCheckpoint: {epoch, time}
    "pets_checkpoint_step": ("lastCheckpoint.step", int, PROGRESS_TOP),  # and its step (after the epoch)
    "pets_resume_step": ("resumeStep", int, PROGRESS_TOP),  # where this attempt began (_work_lost)
    # step checkpoints it could not resume from (_checkpoints_skipped)
    "pets_resume_skipped_checkpoints": ("resumeSkippedCheckpoints", int, PROGRESS_TOP),
}

# What the trainer made of the data (its dataset report, dataset.json): gauge -> status.dataset field,
# and the summary's "dataset" key of each
DATASET_FIELDS = {
    "pets_dataset_images": ("images", int, PROGRESS_TOP),
    "pets_dataset_classes": ("classes", int, PROGRESS_TOP),
    "pets_dataset_skipped": ("skipped", int, PROGRESS_TOP),
    "pets_dataset_train_images": ("trainImages", int, PROGRESS_TOP),
    "pets_dataset_eval_images": ("evalImages", int, PROGRESS_TOP),
}
SUMMARY_DATASET_KEYS = {"images": "images", "classes": "classes", "skipped": "skipped",
                        "train_images": "trainImages", "eval_images": "evalImages"}
DATASET_LAYOUTS = ("synthetic", "flat", "oxford", "imagefolder")

# What a progress read keeps (operator/pets_operator/progress.py): the mirrored fields, the dataset
# report's counts, and the run's time split for status.goodput.
READ_FIELDS = {**PROGRESS_FIELDS, **DATASET_FIELDS, **goodput.GAUGE_FIELDS}


def _mirror_dataset(status: dict[str, Any], counts: dict[str, int], layout: Any = None) -> None:
    """status.dataset: the counts of the trainer's dataset report (and its layout, from the summary)."""
    dataset = {**(status.get("dataset") or {}), **counts}
    if layout in DATASET_LAYOUTS:
        dataset["layout"] = layout
    if dataset:
        status["dataset"] = dataset


def _mirror_progress(status: dict[str, Any], progress: dict[str, float], now: datetime) -> None:
    changed = False
    for metric, (key, kind, _top) in PROGRESS_FIELDS.items():
        if metric not in progress:
            continue
        value = kind(round(progress[metric], 6))
        if key == "lastCheckpoint":
            if value and (status.get(key) or {}).get("epoch") != value:
                status[key] = {"epoch": value, "time": timestamp(now)}
            continue
        if key == "lastCheckpoint.step":  # a step checkpoint mid-epoch moves it without the epoch
            newest = status.get("lastCheckpoint") or {}
            if value and newest.get("step") != value:
                status["lastCheckpoint"] = {**newest, "step": value, "time": timestamp(now)}
            continue
        changed |= status.get(key) != value
        status[key] = value
    if "epoch" in status and "totalEpochs" in status:
        status["progress"] = f"{status['epoch']}/{status['totalEpochs']}"
    _mirror_dataset(status, {key: int(progress[metric])
                             for metric, (key, _kind, _top) in DATASET_FIELDS.items() if metric in progress})
    if changed:  # an unchanged scrape writes nothing, so an idle poll costs no API write
        status["lastProgressTime"] = timestamp(now)


def _work_lost(result: Plan, resume_step: Any) -> None:
    """Once the attempt after a restart says where it resumed (its progress, or its final summary): the
    steps the last one had done past that point, done again. At least: the last attempt's step is as
    last read (every progress interval), so it may have gone further."""
    failure = result.status.get("lastFailure") or {}
    known = isinstance(resume_step, int | float) and not isinstance(resume_step, bool) and \
        0 <= resume_step <= PROGRESS_TOP
    if "lastStep" not in failure or "lostSteps" in failure or not known:
        return
    lost = max(0, int(failure["lastStep"]) - int(resume_step))
    failure["lostSteps"] = lost
    result.events.append(Event("Normal" if lost == 0 else "Warning", "WorkLost", (
        f"attempt {max(0, int(result.status.get('attempt') or 1) - 1)} lost at least {lost} step(s): last "
        f"read at step {failure['lastStep']}, the next attempt resumed at step "
        f"{int(resume_step)}")))


def _checkpoints_skipped(result: Plan, old: dict[str, Any]) -> None:
    """A run that could not resume from the newest step checkpoint(s) says so once: they count steps of
    another world size or steps per epoch (an edit while suspended), so it resumed further back."""
    skipped = result.status.get("resumeSkippedCheckpoints")
    if not skipped or skipped == old.get("resumeSkippedCheckpoints"):
        return
    result.events.append(Event("Warning", "CheckpointSkipped", (
        f"this run could not resume from the {skipped} newest step checkpoint(s): they were made with "
        "another world size or steps per epoch (rank 0's log names them and the values), so it resumed "
        f"further back, at step {result.status.get('resumeStep', 0)} (0: from the start)")))


def _is_count(value: Any) -> bool:
    """An integer (not a bool) in 0..PROGRESS_TOP: a count from the summary a status can hold."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= PROGRESS_TOP


def _mirror_summary(status: dict[str, Any], summary: dict[str, Any], total_epochs: int) -> None:
    status["summary"] = summary  # pods.parse_summary let only numbers a status can hold through

    def number(key: str, top: float) -> float | None:
        value = summary.get(key)
        ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= top
        return float(value) if ok else None  # type: ignore[arg-type]

    # The last progress read may be an epoch old: the run's own final figures win.
    for key, field_name, top in (("final_accuracy", "evalAccuracy", 1.0), ("final_train_loss", "trainLoss",
                                 PROGRESS_TOP), ("images_per_second", "imagesPerSecond", PROGRESS_TOP),
                                 ("elapsed_seconds", "elapsedSeconds", PROGRESS_TOP)):
        if (value := number(key, top)) is not None:
            status[field_name] = value
    if summary.get("status") == "succeeded" and _is_count(status.get("stepsTotal")):
        status["step"] = status["stepsTotal"]  # every step of the run was taken
    if (skipped := number("resume_skipped_checkpoints", PROGRESS_TOP)) is not None:
        status["resumeSkippedCheckpoints"] = int(skipped)
    report = summary.get("dataset")
    if isinstance(report, dict):
        counts = {key: report[name] for name, key in SUMMARY_DATASET_KEYS.items()
                  if _is_count(report.get(name))}
        _mirror_dataset(status, counts, report.get("layout"))
    if _is_count(summary.get("epochs")):
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
    """Decide the next step for one PetsTraining. `target.attempt` must be status.attempt (before that
    field existed: status.restarts)."""
    result = _plan(body, spec, observed, target, now)
    goodput.account(body.get("status") or {}, result.status,
                    (body.get("metadata") or {}).get("creationTimestamp"), now)
    return result


def _plan(body: dict[str, Any], spec: dict[str, Any], observed: Observed, target: builders.Target,
          now: datetime) -> Plan:
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
    if observed.backend_reason:
        status["backendReason"] = observed.backend_reason
    status["replicas"] = spec["replicas"]
    status["restarts"] = restarts
    status["attempt"] = target.attempt
    status["totalEpochs"] = spec["epochs"]
    status["children"] = backend.children_names(target.name, target.attempt)
    if observed.output_reason:  # chosen by the operator: kept, so it never changes under the training
        status["output"], status["outputReason"] = api.output_of(spec), observed.output_reason
    else:
        status.pop("output", None)
        status.pop("outputReason", None)
    if "managedClaim" in api.output_of(spec):
        status["children"]["outputClaim"] = builders.output_claim_name(target.name)
    _output_durable(status, spec, observed, target.name, now, generation)

    # Older attempts' workloads are always cleaned up (a restart deletes, then recreates).
    result.delete += [_ref(w) for w in observed.stale]
    _force_delete_lost(result, observed)

    if made_policy := (old.get("children") or {}).get("networkPolicy"):
        status["children"]["networkPolicy"] = made_policy

    if old_phase in api.FINISHED_PHASES:
        # Terminal: nothing is created again. Only the TTL remains.
        status["workloadActive"] = False
        _ttl(result, spec, status, now)
        return result
    goodput.begin(status, meta.get("creationTimestamp"), now)

    service = backend.build_service(spec, target)
    if service is not None and observed.service is None:
        result.create.append(service)
    policy = _network_policy(result, spec, target, made_policy, started_without=bool(old.get("children")))
    ws = _ranks_decide_success(observed.workload_state(spec["replicas"]), observed, spec["replicas"])
    if observed.workload is None or ws is None:
        status["workloadActive"] = False
        if observed.stale:
            phase = (api.RESTARTING if old_phase == api.RESTARTING else api.SUSPENDED if spec["suspend"]
                     else api.QUEUED if target.queued else api.PENDING)
            reason, message = "WaitingForOldAttempt", "waiting for the previous attempt's workload to go away"
        elif (left := deadline_left(spec, status, now)) is not None and left <= 0:
            phase, reason, message = _deadline_exceeded(result, spec, None, now)
            _apply_phase(result, old_phase, phase, reason, message, now, generation)
            return result
        elif _claim_of_another(observed.output_claim, meta.get("uid")):
            # A training of the same name was deleted and the garbage collector has yet to take its
            # claim: pods made now would mount a claim about to go (and wait for ever).
            phase = api.RESTARTING if old_phase == api.RESTARTING else api.PENDING
            reason = "WaitingForOldClaim"
            message = (f"waiting for the claim {builders.output_claim_name(target.name)} of an earlier "
                       "PetsTraining of this name to be deleted")
            result.requeue_after = CHILD_RETRY_MIN_SECONDS
        else:
            built_for = target if left is None else replace(target, deadline_left=max(1, math.ceil(left)))
            workload = backend.build_workload(spec, built_for)
            if policy is not None and not made_policy and policy not in result.create:
                result.create.append(policy)  # before the first pods
                status["children"]["networkPolicy"] = policy["metadata"]["name"]
            # The managed output claim before the pods that mount it; made once (an existing one is kept).
            if (claim := builders.build_output_claim(spec, target)) is not None:
                result.create.append(claim)
                if not builders.owned(claim) and target.attempt == 0:  # said once, where it is seen
                    result.events.append(Event("Normal", "OutputClaimRetained", (
                        f"the claim {claim['metadata']['name']} has retentionPolicy Retain: it stays, with "
                        "the work, when this PetsTraining is deleted; delete it with kubectl delete pvc -n "
                        f"{target.namespace} {claim['metadata']['name']}")))
            # spec.dataset.url's cache, shared by the trainings on the same data: an existing one is kept
            if (cache := builders.build_dataset_cache_claim(spec, target)) is not None:
                result.create.append(cache)
            result.create.append(workload)
            status["workloadActive"] = not builders.created_suspended(spec, target)
            reason = "Created"
            message = f"created {workload['kind']} {workload['metadata']['name']}"
            if spec["suspend"]:
                phase = api.SUSPENDED
            elif target.queued:
                phase, reason = api.QUEUED, "WaitingForAdmission"
                message += f", suspended until Kueue admits it from queue {_queue_name(target)}"
            else:
                phase = api.RESTARTING if restarts else api.PENDING
            if spec["backend"] == "auto" and old.get("backend") != backend.name:  # a choice: say it
                result.events.append(Event("Normal", "BackendSelected",
                                           f"running as a {backend.kind}: {observed.backend_reason}"))
            result.events.append(Event("Normal", "Created", message))
        status["activeReplicas"] = 0
        status["readyReplicas"] = 0
        _apply_phase(result, old_phase, phase, reason, message, now, generation)
        return result
    status["workloadActive"] = (not backend.is_suspended(observed.workload)
                                and ws.phase not in api.FINISHED_PHASES)
    if ws.phase not in api.FINISHED_PHASES and _built_from_older_spec(observed.workload, spec):
        _rebuild(result, spec, observed, target, old_phase, now, generation)
        return result

    status["activeReplicas"] = ws.active
    status["readyReplicas"] = ws.ready
    if ws.start_time and not status.get("startTime"):
        status["startTime"] = ws.start_time
    if observed.progress:
        _mirror_progress(status, observed.progress, now)
        goodput.read_attempt(status, target.attempt, observed.rank0_running_since, observed.progress)
        _checkpoints_skipped(result, old)
        _work_lost(result, observed.progress.get("pets_resume_step"))

    phase, reason, message = ws.phase, ws.reason, ws.message
    left = deadline_left(spec, status, now)
    if phase == api.SUCCEEDED:
        status.pop("pendingSince", None)
        status["completionTime"] = ws.completion_time or timestamp(now)
        if observed.summary:  # the run may have finished before a progress read: its summary says it
            _mirror_summary(status, observed.summary, spec["epochs"])
            goodput.read_summary(status, target.attempt, observed.summary)
            _work_lost(result, observed.summary.get("resume_step"))
            _checkpoints_skipped(result, old)
        acc = status.get("evalAccuracy")
        message = "training finished" + (f": accuracy {acc:.4f}" if isinstance(acc, float) else "")
        if target.queued:  # it ran, so Kueue admitted it (perhaps between two polls)
            status["queue"] = {**(status.get("queue") or {}), "name": _queue_name(target), "admitted": True,
                               "message": ""}
    elif phase == api.FAILED and left is not None and left <= DEADLINE_SLACK_SECONDS:
        # The workload's own deadline (what was left of the training's) ended it: no restart.
        phase, reason, message = _deadline_exceeded(result, spec, None, now)
    elif phase == api.FAILED or (_lost_current(observed) and not backend.is_suspended(observed.workload)):
        # A pod on a lost node never ends, so the workload never fails by itself: the attempt has.
        status.pop("pendingSince", None)
        phase, reason, message = _after_failure(result, spec, observed, ws, restarts, now)
    elif target.queued:
        phase, reason, message = _while_queued(result, spec, observed, ws, target, restarts, now)
    else:
        phase, reason, message = _while_active(result, spec, observed, ws, restarts, now)
    if left is not None and phase not in api.FINISHED_PHASES:
        phase, reason, message = _watch_deadline(result, spec, observed, (phase, reason, message), now)
    _apply_phase(result, old_phase, phase, reason, message, now, generation)
    _progress_reported(result, observed, now, generation)
    _stalled(result, spec, now, generation)
    if phase in api.FINISHED_PHASES:
        _ttl(result, spec, status, now)
    return result


def _claim_of_another(claim: dict[str, Any] | None, uid: str | None) -> bool:
    """The output claim exists and goes (being deleted, or owned by a training that is no more). A claim
    with no owner (Retain) is kept work: it is used as it is."""
    if claim is None:
        return False
    meta = claim.get("metadata") or {}
    owners = [o.get("uid") for o in meta.get("ownerReferences") or []]
    return bool(meta.get("deletionTimestamp")) or (bool(owners) and uid not in owners)


def _ranks_decide_success(ws: WorkloadState | None, observed: Observed, replicas: int
                          ) -> WorkloadState | None:
    """Succeeded as soon as every rank's pod has: the workload's own Complete follows, as its controller
    catches up (a Succeeded pod is never undone, so the training's result cannot change)."""
    if ws is None or ws.phase in api.FINISHED_PHASES or not observed.pods:
        return ws
    finished = pods.all_ranks_succeeded(observed.pods, replicas, observed.backend.rank_of)
    if finished is None:
        return ws
    return WorkloadState(api.SUCCEEDED, "AllRanksSucceeded", f"all {replicas} ranks finished",
                         start_time=ws.start_time,
                         completion_time=timestamp(parse_timestamp(finished)) if finished else None)


def _queue_name(target: builders.Target) -> str:
    return target.queue_labels.get(api.KUEUE_QUEUE_LABEL, "")


def _built_from_older_spec(workload: dict[str, Any], spec: dict[str, Any]) -> bool:
    """The workload was built from a spec since edited (while it was suspended or queued). A workload
    from before the annotation existed is taken as current."""
    built_from = ((workload.get("metadata") or {}).get("annotations") or {}).get(api.ANNOTATION_SPEC_DIGEST)
    return bool(built_from) and built_from != builders.spec_digest(spec)


def _rebuild(result: Plan, spec: dict[str, Any], observed: Observed, target: builders.Target,
             old_phase: str | None, now: datetime, generation: int | None) -> None:
    """No edit is lost: a workload built from an older spec is replaced by one built from this spec, as a
    new attempt that is not a restart (nothing failed). Checkpoints carry over where their shape allows
    (`builders.checkpoint_dir`)."""
    status = result.status
    assert observed.workload is not None
    status["attempt"] = target.attempt + 1
    policy = {k: v for k, v in status["children"].items() if k == "networkPolicy"}  # one for all attempts
    status["children"] = observed.backend.children_names(target.name, target.attempt + 1) | policy
    result.delete.append(_ref(observed.workload))
    kind, name = observed.workload["kind"], observed.workload["metadata"]["name"]
    message = (f"spec changed (generation {generation}) since {kind} {name} was built: "
               "rebuilding it from the new spec")
    if status.get("workloadActive") and spec["suspend"]:  # edited as it was being suspended
        message += "; its pods stop now, and the rebuilt workload starts on resume"
    elif status.get("workloadActive"):
        message += "; its pods restart from the newest checkpoint of this shape (not counted as a restart)"
    result.events.append(Event("Normal", "Rebuilding", message))
    result.requeue_after = 0.0
    phase = (api.SUSPENDED if spec["suspend"] else api.QUEUED if target.queued
             else api.RESTARTING if old_phase == api.RESTARTING else api.PENDING)
    status["workloadActive"] = False
    _apply_phase(result, old_phase, phase, "Rebuilding", message, now, generation)


def _failure_record(failure: pods.Failure, now: datetime) -> dict[str, Any]:
    record: dict[str, Any] = {
        "cause": failure.cause, "pod": failure.pod, "message": failure.message,
        "time": timestamp(parse_timestamp(failure.finished_at)) if failure.finished_at else timestamp(now),
    }
    for key, value in (("rank", failure.rank), ("node", failure.node), ("exitCode", failure.exit_code),
                       ("logTail", failure.log_tail)):
        if value is not None:
            record[key] = value
    return record


def _force_delete_lost(result: Plan, observed: Observed) -> None:
    """Every pod stuck on a lost node is force-deleted (after the status write, see handlers._carry_out):
    no kubelet will confirm its end, and until it is gone its workload's deletion, and so the next
    attempt, waits for it."""
    for pod in observed.lost_pods:
        meta = pod.get("metadata") or {}
        node = pods.node_of(pod)
        result.force_delete.append({"name": str(meta.get("name")), "uid": str(meta.get("uid") or "")})
        result.events.append(Event("Warning", "NodeLost", (
            f"node {node} stopped responding ({observed.lost_nodes.get(node, 'lost')}): force-deleting "
            f"pod {meta.get('name')}, which no kubelet will ever finish")))


def _lost_current(observed: Observed) -> pods.Failure | None:
    """The current attempt's first pod on a lost node, as its failure (None: none is)."""
    current = {(p.get("metadata") or {}).get("name") for p in observed.pods or []}
    lost = [p for p in observed.lost_pods if (p.get("metadata") or {}).get("name") in current]
    if not lost:
        return None
    pod = min(lost, key=lambda p: observed.backend.rank_of(p) or 0)
    return pods.lost_node_failure(pod, observed.lost_nodes.get(pods.node_of(pod), "lost"),
                                  observed.backend.rank_of)


def _after_failure(result: Plan, spec: dict[str, Any], observed: Observed, ws: WorkloadState,
                   restarts: int, now: datetime) -> tuple[str, str, str]:
    """The one restart rule: the cluster's failures restart the gang for free, the training's count,
    and an error the trainer calls permanent (or the workload's own failure policy) ends it at once.
    A pod on a lost node is the cluster's failure, and explains its peers' (they lost it)."""
    status = result.status
    assert observed.workload is not None
    trainer_error = (observed.summary or {}).get("error")
    failure = _lost_current(observed) or pods.first_failure(observed.pods or [], observed.backend.rank_of)
    disrupted = bool(observed.backend.disrupted_reason) and ws.reason == observed.backend.disrupted_reason
    if disrupted and failure is not None and (not failure.caused_by_cluster or failure.cause == "Stopped"):
        # The disrupted pod is gone (an eviction deletes it); its peers' exits only say they lost it, or
        # (exit 75) that they stopped with it, after the step checkpoint its SIGTERM asked for.
        failure = None
    detail = failure.message if failure else ws.message
    if trainer_error and failure is None:
        detail = f"{ws.message}; trainer: {trainer_error}"
    if failure is not None:
        status["lastFailure"] = _failure_record(failure, now)
    disruptions = int(status.get("disruptions") or 0)
    counted = restarts - disruptions
    permanent = (failure is not None and failure.permanent) or ws.reason == observed.backend.permanent_reason
    by_cluster = (failure is not None and failure.caused_by_cluster) or disrupted
    if failure is None and disrupted:  # the disrupted pod is gone; the Job's condition says what it was
        status["lastFailure"] = {"cause": "Disrupted", "message": ws.message,
                                 "time": ws.completion_time or timestamp(now)}
    if (failure is not None or disrupted) and isinstance(status.get("step"), int):
        status["lastFailure"]["lastStep"] = status["step"]  # how far it got (as last read): lostSteps
    if observed.summary:  # a stopped or failed trainer's own split of this attempt
        goodput.read_summary(status, int(status["attempt"]), observed.summary)
    if not permanent and (by_cluster or counted < spec["maxRestarts"]):
        status["restarts"] = restarts + 1
        status["attempt"] = int(status["attempt"]) + 1
        if by_cluster:
            status["disruptions"] = disruptions + 1
        result.delete.append(_ref(observed.workload))
        resume = _resume_point(spec, status, observed.summary)
        cost = ("not counted: the cluster ended the pod" if by_cluster
                else f"{counted + 1}/{spec['maxRestarts']}")
        message = f"attempt {restarts} failed ({detail}); restarting the gang ({cost}), {resume}"
        result.events.append(Event("Warning", "Restarting", message))
        result.requeue_after = 0.0
        return api.RESTARTING, "GangRestart", message
    status["completionTime"] = ws.completion_time or timestamp(now)
    if permanent:
        return api.FAILED, "PermanentError", f"failed: {detail} (a restart cannot fix this)"
    if spec["maxRestarts"]:
        return api.FAILED, "MaxRestartsExceeded", f"failed after {counted} counted restart(s): {detail}"
    return api.FAILED, ws.reason, f"failed: {detail}"


# Phases whose time does not count against spec.activeDeadlineSeconds.
PAUSED_PHASES = (api.SUSPENDED, api.QUEUED, api.PREEMPTED)
# A workload that failed this close to the training's deadline was ended by it (its own deadline is what
# was left, rounded up to whole seconds).
DEADLINE_SLACK_SECONDS = 2.0


def deadline_left(spec: dict[str, Any], status: dict[str, Any], now: datetime) -> float | None:
    """Seconds left of spec.activeDeadlineSeconds, counted from status.startTime without the time paused
    (status.deadline); None without a deadline. Before the training has started, all of it."""
    limit = spec.get("activeDeadlineSeconds")
    if not limit:
        return None
    start = status.get("startTime")
    if not start:
        return float(limit)
    book = status.get("deadline") or {}
    paused = float(book.get("pausedSeconds") or 0.0)
    if book.get("pausedSince"):
        paused += max(0.0, (now - parse_timestamp(book["pausedSince"])).total_seconds())
    return float(limit) - ((now - parse_timestamp(start)).total_seconds() - paused)


def _watch_deadline(result: Plan, spec: dict[str, Any], observed: Observed, decided: tuple[str, str, str],
                    now: datetime) -> tuple[str, str, str]:
    """Book this round's pause (Suspended, Queued, Preempted) and end the training once its deadline has
    run out while it was not paused; else wake it when the deadline comes."""
    status, phase = result.status, decided[0]
    book = status.setdefault("deadline", {})
    if phase in PAUSED_PHASES:
        book.setdefault("pausedSince", timestamp(now))
        return decided
    if book.get("pausedSince"):
        pause = max(0.0, (now - parse_timestamp(book.pop("pausedSince"))).total_seconds())
        book["pausedSeconds"] = round(float(book.get("pausedSeconds") or 0.0) + pause, 3)
    left = deadline_left(spec, status, now)
    if left is None:
        return decided
    if left <= 0 and status.get("startTime"):
        return _deadline_exceeded(result, spec, observed.workload, now)
    result.requeue_after = left if result.requeue_after is None else min(result.requeue_after, left)
    return decided


def _deadline_exceeded(result: Plan, spec: dict[str, Any], workload: dict[str, Any] | None,
                       now: datetime) -> tuple[str, str, str]:
    """The training's deadline ran out: Failed, no restart, no new workload; the running one goes."""
    status = result.status
    status.pop("pendingSince", None)
    status["completionTime"] = timestamp(now)
    if workload is not None:
        result.delete.append(_ref(workload))
    paused = float((status.get("deadline") or {}).get("pausedSeconds") or 0.0)
    message = (f"spec.activeDeadlineSeconds={spec['activeDeadlineSeconds']} ran out (counted from "
               f"{status.get('startTime')}, {paused:.0f} s Suspended, Queued or Preempted not counted); "
               "not restarted")
    result.events.append(Event("Warning", "DeadlineExceeded", message))
    return api.FAILED, "DeadlineExceeded", message


# status.outputReason: why the operator chose the output of a training without spec.output.
OPERATOR_DEFAULT = "OperatorDefault"  # `pets-operator run --default-output` (the chart's defaultOutput)
NO_DEFAULT_STORAGE_CLASS = "NoDefaultStorageClass"  # a default claim could not be made: an emptyDir
OUTPUT_REASONS = (OPERATOR_DEFAULT, NO_DEFAULT_STORAGE_CLASS)
_EMPTYDIR_FIX = ("set spec.output.managedClaim.storageClassName (the operator makes a claim of that "
                 "class), spec.output.persistentVolumeClaim, or give the cluster a default StorageClass")


def _output_durable(status: dict[str, Any], spec: dict[str, Any], observed: Observed, name: str,
                    now: datetime, generation: int | None) -> None:
    """OutputDurable: whether the work outlives the pods (a restart resumes, `fetch` has files), and how
    to get there when it does not. Unknown while the claim is Pending and a pod waits for it."""
    output = api.output_of(spec)
    claim = observed.output_claim
    pending = claim is not None and (claim.get("status") or {}).get("phase") == "Pending"
    durable: bool | None
    if pending:
        assert claim is not None
        claim_name = claim["metadata"]["name"]
        durable, reason = None, "ClaimPending"
        modes = claim["spec"].get("accessModes") or []
        message = (f"the claim {claim_name} (StorageClass {claim['spec'].get('storageClassName') or 'none'}"
                   f", {', '.join(modes)}) is Pending and the pods wait for it to bind: `kubectl describe "
                   f"pvc {claim_name}` says why")
        if "ReadWriteMany" in modes:
            message += (" (a class without ReadWriteMany never binds it: name one that has it in "
                        "spec.output.managedClaim.storageClassName, or keep the pods on one node with "
                        "accessModes [ReadWriteOnce])")
    elif "managedClaim" in output:
        retention = output["managedClaim"].get("retentionPolicy") or "Delete"
        durable, reason = True, "ManagedClaim"
        message = (f"checkpoints and results are on the claim {builders.output_claim_name(name)}, which the "
                   f"operator made (retentionPolicy {retention})")
        if observed.output_reason:
            message = "spec.output is unset, so " + message
    elif "persistentVolumeClaim" in output:
        durable, reason = True, "Claim"
        message = f"checkpoints and results are on the claim {output['persistentVolumeClaim']['claimName']}"
    elif observed.output_reason == NO_DEFAULT_STORAGE_CLASS:
        durable, reason = False, NO_DEFAULT_STORAGE_CLASS
        message = ("spec.output is unset and the cluster has no default StorageClass, so the operator made "
                   "no claim and fell back to an emptyDir, which goes with the pods: a restart or an "
                   f"eviction starts from epoch 0 and `kubectl pets fetch` finds nothing; {_EMPTYDIR_FIX}")
    else:
        durable, reason = False, "EmptyDir"
        where = ("spec.output is unset and the operator's default output is an emptyDir (the chart's "
                 "defaultOutput.managedClaim.enabled=false)" if observed.output_reason
                 else "spec.output is an emptyDir")
        message = (f"{where}, which goes with the pods: a restart or an eviction starts from epoch 0 and "
                   "`kubectl pets fetch` finds nothing; set spec.output.managedClaim: {} (the operator makes "
                   "a claim) or spec.output.persistentVolumeClaim")
    _set_condition(status["conditions"], "OutputDurable", durable, reason, message, now, generation)


def _resume_point(spec: dict[str, Any], status: dict[str, Any], summary: dict[str, Any] | None = None) -> str:
    if "emptyDir" in api.output_of(spec):
        return "starting from epoch 0 (the output is an emptyDir, which goes with the pods)"
    if (summary or {}).get("status") == "stopped" and isinstance((summary or {}).get("global_step"), int):
        assert summary is not None
        return f"resuming at step {summary['global_step']}, from the checkpoint it saved on SIGTERM"
    checkpoint = status.get("lastCheckpoint") or {}
    if checkpoint.get("step"):  # the trainer's newest, an epoch's or a step checkpoint
        return f"resuming from the newest checkpoint, at step {checkpoint['step']} or later"
    if checkpoint.get("epoch"):
        epoch, total, steps = checkpoint["epoch"], status.get("totalEpochs"), status.get("stepsTotal")
        # Checkpoints are taken at epoch ends, and every epoch has the same number of steps.
        at_step = f", step {epoch * steps // total}" if total and steps and steps % total == 0 else ""
        return f"resuming from the checkpoint of epoch {epoch}{at_step}"
    return "resuming from the newest checkpoint"


def _while_active(result: Plan, spec: dict[str, Any], observed: Observed, ws: WorkloadState,
                  restarts: int, now: datetime) -> tuple[str, str, str]:
    """Not finished: suspend or resume, or say what the pods are doing."""
    status = result.status
    assert observed.workload is not None
    phase, reason, message = ws.phase, ws.reason, ws.message
    # Suspend / resume go through the workload's own suspend field.
    if observed.backend.is_suspended(observed.workload) != bool(spec["suspend"]):
        result.suspend = bool(spec["suspend"])
        result.suspend_workload = observed.workload["metadata"]["name"]
        status.pop("pendingSince", None)
        if spec["suspend"]:
            phase, reason, message = api.SUSPENDED, "Suspending", "suspending the training"
        else:
            phase, reason, message = api.PENDING, "Resuming", "resuming the training"
        result.events.append(Event("Normal", "Suspended" if spec["suspend"] else "Resumed", message))
        return phase, reason, message
    if phase == api.SUSPENDED:
        status.pop("pendingSince", None)
        return phase, reason, message
    # The workload's count says pods exist; only the pods say whether they run. With no pod visible
    # yet (just created), the workload's own view stands, unless the API server refused to create them.
    if observed.pods or observed.workload_refusals:
        phase, reason, message = _from_pods(result, spec, observed)
    if phase == api.RUNNING:
        status.pop("pendingSince", None)
        return phase, reason, message
    status.setdefault("pendingSince", timestamp(now))
    timeout = (spec.get("scheduling") or {}).get("pendingTimeoutSeconds")
    waited = (now - parse_timestamp(status["pendingSince"])).total_seconds()
    if timeout is not None and waited >= timeout:
        status["completionTime"] = timestamp(now)
        status.pop("pendingSince", None)
        result.delete.append(_ref(observed.workload))
        return api.FAILED, "PendingTimeout", (f"did not start within spec.scheduling.pendingTimeoutSeconds="
                                              f"{timeout}: {message}")
    if timeout is not None:
        result.requeue_after = max(0.0, timeout - waited)
    return (api.RESTARTING if restarts else api.PENDING), reason, message


def _kueue_conditions(queue_workload: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    conditions = ((queue_workload or {}).get("status") or {}).get("conditions") or []
    return {c.get("type", ""): c for c in conditions}


def _while_queued(result: Plan, spec: dict[str, Any], observed: Observed, ws: WorkloadState,
                  target: builders.Target, restarts: int, now: datetime) -> tuple[str, str, str]:
    """A workload in a Kueue queue: Kueue alone flips its suspend (admission, preemption). The user's
    spec.suspend goes through Kueue's own switch, the Workload's spec.active; Kueue's reasons are
    mirrored into status in its own words."""
    status = result.status
    assert observed.workload is not None
    queue = _queue_name(target)
    if not observed.queue_served:
        status["queue"] = {"name": queue, "admitted": False,
                           "message": "Kueue is not installed (workloads.kueue.x-k8s.io is not served)"}
        return (api.QUEUED, "QueueUnavailable",
                f"labelled {api.KUEUE_QUEUE_LABEL}={queue}, but Kueue is not installed in this cluster, so "
                f"nothing will admit the workload: install Kueue or remove the label")
    qw = observed.queue_workload
    conds = _kueue_conditions(qw)
    admitted = conds.get("Admitted", {}).get("status") == "True"
    if qw is not None:
        wanted = not spec["suspend"]
        if bool((qw.get("spec") or {}).get("active", True)) != wanted:
            result.queue_active, result.queue_workload = wanted, qw["metadata"]["name"]
            result.events.append(Event("Normal", "Resumed" if wanted else "Suspended",
                                       f"{'activating' if wanted else 'deactivating'} Kueue Workload "
                                       f"{qw['metadata']['name']}"))
    suspended = observed.backend.is_suspended(observed.workload)
    if spec["suspend"]:
        status.pop("pendingSince", None)
        detail = "" if suspended else "; its pods stop once Kueue suspends the workload"
        message = (f"suspended: Kueue Workload {qw['metadata']['name']} is deactivated{detail}" if qw
                   else "suspended: Kueue's Workload is deactivated as soon as Kueue has made it")
        status["queue"] = _queue_status(queue, qw, admitted, message)
        return api.SUSPENDED, "Deactivated", message
    if not suspended:  # admitted: Kueue unsuspended it; from here on the pods tell
        status["queue"] = _queue_status(queue, qw, True, "")
        return _while_active(result, spec, observed, ws, restarts, now)
    status.pop("pendingSince", None)
    evicted = next((c for t in ("Evicted", "Preempted") if (c := conds.get(t, {})).get("status") == "True"
                    and c.get("reason") not in KUEUE_NOT_PREEMPTION), None)
    old_phase = result.status.get("phase")
    if evicted or old_phase in (api.RUNNING, api.PREEMPTED):
        why = evicted or {}
        message = (f"preempted by Kueue ({why.get('reason') or 'Evicted'}: "
                   f"{why.get('message') or 'suspended'}); it waits to be admitted again and then resumes "
                   "from its newest checkpoint (not a failure)")
        status["queue"] = _queue_status(queue, qw, False, why.get("message") or "")
        if old_phase != api.PREEMPTED:
            result.events.append(Event("Warning", "Preempted", message))
        return api.PREEMPTED, why.get("reason") or "Preempted", message
    waiting = conds.get("QuotaReserved") or {}
    backend = observed.backend
    no_workload = (f"Kueue has made no Workload for the {backend.kind} yet (if this lasts: is Kueue's "
                   f"{backend.group}/{backend.name} integration enabled?)")
    kueue_says = waiting.get("message") or (no_workload if qw is None else "waiting for admission")
    message = f"queued in {queue}: {kueue_says}"
    status["queue"] = _queue_status(queue, qw, False, kueue_says)
    if old_phase != api.QUEUED:
        result.events.append(Event("Normal", "Queued", message))
    return api.QUEUED, waiting.get("reason") or "WaitingForAdmission", message


# Kueue's eviction reasons that are the user's doing, not a preemption: the Workload was deactivated
# (spec.suspend) and is being activated again.
KUEUE_NOT_PREEMPTION = ("InactiveWorkload", "Deactivated")


def _queue_status(queue: str, qw: dict[str, Any] | None, admitted: bool, message: str) -> dict[str, Any]:
    out: dict[str, Any] = {"name": queue, "admitted": admitted, "message": message}
    if qw is not None:
        out["workload"] = qw["metadata"]["name"]
    return out


def _from_pods(result: Plan, spec: dict[str, Any], observed: Observed) -> tuple[str, str, str]:
    replicas = spec["replicas"]
    pod_list = observed.pods or []
    running = pods.running_count(pod_list)
    if running >= replicas:
        return api.RUNNING, "PodsRunning", f"{running}/{replicas} pods running"
    waiting = pods.worst_waiting(pod_list, observed.pod_events)
    refused = pods.create_refused(observed.workload_refusals) if len(pod_list) < replicas else None
    if refused is not None:
        waiting = refused, replicas - len(pod_list)
    if waiting is None:
        return api.PENDING, "WaitingForPods", f"{running}/{replicas} pods running, waiting for the rest"
    why, count = waiting
    message = f"{count}/{replicas} pod(s) waiting: {why.message}"
    old_reason = next((c.get("reason") for c in result.status["conditions"]
                       if c["type"] == "Progressing"), None)
    routine = ("FetchingDataset", "ContainerCreating", "WaitingForPods")  # said in status, no Warning
    if why.reason != old_reason and why.reason not in routine:
        result.events.append(Event("Warning", why.reason, message))  # one per new reason, not per poll
    return api.PENDING, why.reason, message


def _stalled(result: Plan, spec: dict[str, Any], now: datetime, generation: int | None) -> None:
    """Stalled: a Running training whose progress has not moved for longer than its own pace allows."""
    status = result.status
    bound = stall_bound(spec, status)
    last = status.get("lastProgressTime") or status.get("startTime")
    if status.get("phase") != api.RUNNING or bound is None or not last:
        if any(c["type"] == "Stalled" for c in status["conditions"]):
            _set_condition(status["conditions"], "Stalled", False, "NotRunning", "", now, generation)
        return
    quiet = (now - parse_timestamp(last)).total_seconds()
    stalled = quiet > bound
    was = next((c for c in status["conditions"] if c["type"] == "Stalled" and c["status"] == "True"), None)
    message = (f"no progress since {last} ({quiet:.0f} s, more than {bound:.0f} s)" if stalled else "")
    _set_condition(status["conditions"], "Stalled", stalled, "NoProgress" if stalled else "Progressing",
                   message, now, generation)
    if stalled and not was:
        result.events.append(Event("Warning", "Stalled", message))
    if not stalled:
        left = bound - quiet
        result.requeue_after = left if result.requeue_after is None else min(result.requeue_after, left)


PROGRESS_GRACE_SECONDS = 30.0  # the trainer serves its gauges a few seconds after it starts
# Reads must have failed this long (a second scrape, 10 s after the first) before status says so.
PROGRESS_CONFIRM_SECONDS = 15.0


# The scraper's words for a rank 0 it could not reach (scraper._describe). Any other error means rank 0
# answered with something the operator refused: a redirect, a compressed or oversized body, a bad value.
UNREACHABLE_ERRORS = ("timed out", "cannot connect", "server disconnected", "connection error")


def unreachable(progress_error: str) -> bool:
    """Whether a scrape's error says rank 0 could not be reached (the error is "<url>: <kind>")."""
    kind = progress_error.rsplit("/metrics: ", 1)[-1]
    return kind.startswith(UNREACHABLE_ERRORS)


def _progress_reported(result: Plan, observed: Observed, now: datetime, generation: int | None) -> None:
    """ProgressReported: False, with the reason, when a running rank 0's gauges cannot be read (a
    NetworkPolicy, a crashed metrics server, a wrong port); one Warning Event when that starts."""
    status = result.status
    if status.get("phase") != api.RUNNING:
        return
    if observed.progress is not None:
        _set_condition(status["conditions"], "ProgressReported", True, "Scraped", "", now, generation)
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
        result.requeue_after = left if result.requeue_after is None else min(result.requeue_after, left)
        return
    if unreachable(observed.progress_error):
        reason = "EndpointUnreachable"
        message = (f"rank 0's progress cannot be read: {observed.progress_error}; the operator must reach "
                   f"the trainer's metrics port (NetworkPolicy: the training's own admits the operator's "
                   f"pods and the chart's trainingNetworkPolicy.metricsFrom; a namespace's other policies "
                   f"may deny it, see the chart's networkPolicy.enabled)")
    else:
        reason = "ProgressRefused"
        message = (f"rank 0's progress was refused: {observed.progress_error}; its metrics endpoint must "
                   "serve the pets_* gauges as the trainer does (docs/contract.md)")
    was = next((c for c in status["conditions"] if c["type"] == "ProgressReported"), None)
    _set_condition(status["conditions"], "ProgressReported", False, reason, message, now, generation)
    if not was or was.get("status") != "False":
        result.events.append(Event("Warning", "ProgressUnreadable", message))


STALL_MIN_SECONDS = 120.0
STALL_STEPS = 20  # this many steps' time without progress


def stall_bound(spec: dict[str, Any], status: dict[str, Any]) -> float | None:
    """Seconds without progress after which a Running training is Stalled: spec.stallTimeoutSeconds,
    else 20 of its own steps (at least 2 minutes), once it has taken a step to measure."""
    explicit = (spec.get("scheduling") or {}).get("stallTimeoutSeconds")
    if explicit:
        return float(explicit)
    steps, elapsed = status.get("step"), status.get("elapsedSeconds")
    if not steps or not elapsed:
        return None
    return max(STALL_MIN_SECONDS, STALL_STEPS * float(elapsed) / float(steps))


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
    goodput.book_phase(status, old_phase, phase, now)
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
    old = body.get("status") or {}
    old_since = old.get("pendingSince")
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
        result = _plan_without_workload(body, api.FAILED, reason, message, now)
        result.status.pop("pendingSince", None)
        result.status["completionTime"] = timestamp(now)
        result.delete = [_ref(obj) for obj in cleanup or []]
    else:
        phase = api.RESTARTING if old.get("phase") == api.RESTARTING else api.PENDING
        message = f"waiting to create {child}: {error}; retrying"
        result = _plan_without_workload(body, phase, "ChildCreateRetrying", message, now)
        result.status["pendingSince"] = old_since or timestamp(now)
        delay = min(max(waited, CHILD_RETRY_MIN_SECONDS), CHILD_RETRY_MAX_SECONDS)
        result.requeue_after = delay if timeout is None else max(0.0, min(delay, timeout - waited))
    if "workloadActive" in result.status:
        result.status["workloadActive"] = False  # its workload was not created
    if child.startswith("PersistentVolumeClaim "):  # the output claim: the work has nowhere durable to go
        _set_condition(result.status.setdefault("conditions", []), "OutputDurable", False, "ClaimRefused",
                       f"the API server refused the output claim {child.split(' ', 1)[1]}: {error}", now,
                       (body.get("metadata") or {}).get("generation"))
    return result
