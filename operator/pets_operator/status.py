"""Pure lifecycle logic: (spec, old status, observed children, progress) -> a Plan.

A Plan says what status to write, which Kubernetes objects to create or delete, and which Events
to emit. `reconcile.py` observes the cluster, calls `plan()`, and `act.py` carries the Plan out; they
decide nothing themselves. Everything here is deterministic given its inputs (time is passed in).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from pets_contract import gauges
from pets_operator import api, builders, checkpoint_home, children, goodput, pods, resize, tracking_status
from pets_operator.backends import WorkloadState, parse_timestamp, timestamp
from pets_operator.claim_binding import poll_after, waiting_message
from pets_operator.conditions import apply_phase
from pets_operator.deadlines import (
    DEADLINE_SLACK_SECONDS,
    deadline_exceeded,
    deadline_left,
    pending_timed_out,
    watch_deadline,
)
from pets_operator.ended_runs import book as book_ended_runs
from pets_operator.mirror import (
    checkpoints_skipped,
    mirror_progress,
    mirror_summary,
    older_than_status,
    work_lost,
)
from pets_operator.output_durability import output_durable
from pets_operator.plan_types import Event, Observed, Plan, ref
from pets_operator.queueing import QueueStatus, queue_name, while_queued
from pets_operator.refusals import CHILD_RETRY_MIN_SECONDS
from pets_operator.resize import NODE_LOST, PARTIAL_ADMISSION, SCALED
from pets_operator.restarts import after_failure, force_delete_lost, lost_current
from pets_operator.spec import Spec
from pets_operator.stall import progress_reported, stalled
from pets_operator.status_types import Status


def plan(
    body: dict[str, Any],
    spec: Spec,
    observed: Observed,
    target: builders.Target,
    now: datetime,
    old: Status | None = None,
) -> Plan:
    """Decide the next step for one PetsTraining. `target.attempt` must be status.attempt (before that
    field existed: status.restarts); `old`, body's status typed, when the caller has made it already.
    The round, step by step:

    1. `_begin`: the fields every round writes, the output and its durability, older attempts cleaned up;
    2. a finished training keeps only its TTL (`_ttl`);
    3. `_service_and_network_policy`: the children every attempt shares;
    4. without a workload: `_without_workload` waits or creates one;
    5. with one built from an edited spec: `_rebuild`;
    6. with one: `_read_progress`, then `_with_workload` says where it stands;
    7. goodput accounts the round's time."""
    r = _begin(body, spec, observed, target, now, old)
    if r.old.phase in api.FINISHED_PHASES:  # terminal: nothing is created again, only the TTL remains
        r.status.workload_active = False
        _ttl(r.result, spec, r.status, now)
    else:
        goodput.begin(r.status, r.meta.get("creationTimestamp"), now)
        book_ended_runs(r.status, observed.ended_runs)  # before this round's reads: they are older runs
        policy = _service_and_network_policy(r)
        ws = _workload_state(observed, r.size)
        if observed.workload is None or ws is None:
            _without_workload(r, policy)
        else:
            r.status.workload_active = (not observed.backend.is_suspended(observed.workload)
                                        and ws.phase not in api.FINISHED_PHASES)
            edited = ws.phase not in api.FINISHED_PHASES and _built_from_older_spec(observed.workload, spec)
            if edited and not resize.refused(r.result, spec, observed, r.old):
                _rebuild(r)
            elif ws.phase not in api.FINISHED_PHASES and (smaller := _smaller(r, ws)) is not None:
                _rebuild(r, smaller)
            else:
                _read_progress(r, ws)
                _with_workload(r, ws)
    resize.settle(r.status, r.status.phase or "")
    goodput.account(r.old, r.status, r.meta.get("creationTimestamp"), now)
    return r.result


@dataclass
class _Round:
    """One planning round: its inputs, the old status, and the Plan it fills in."""

    spec: Spec
    observed: Observed
    target: builders.Target
    now: datetime
    meta: dict[str, Any]
    old: Status
    result: Plan

    @property
    def status(self) -> Status:
        return self.result.status

    @property
    def generation(self) -> int | None:
        return self.meta.get("generation")

    @property
    def restarts(self) -> int:
        return int(self.old.restarts or 0)

    @property
    def children(self) -> dict[str, str]:
        assert self.status.children is not None  # _begin sets it, as it sets replicas
        return self.status.children

    @property
    def size(self) -> int:
        assert self.status.replicas is not None
        return self.status.replicas

    @property
    def made_policy(self) -> str | None:
        return (self.old.children or {}).get("networkPolicy")

    def phase(self, phase: str, reason: str, message: str) -> None:
        apply_phase(self.result, self.old.phase, phase, reason, message, self.now, self.generation,
                    self.observed.rank0_running_since)


def _begin(body: dict[str, Any], spec: Spec, observed: Observed, target: builders.Target,
           now: datetime, old: Status | None) -> _Round:
    """The fields every round writes, the output and its durability; older attempts' workloads are always
    cleaned up (a restart deletes, then recreates), and pods stuck on a lost node force-deleted."""
    old = Status.from_dict(body.get("status") or {}) if old is None else old
    status = old.copy()
    r = _Round(spec, observed, target, now, body.get("metadata") or {}, old, Plan(status=status))
    backend = observed.backend
    status.observed_generation = r.generation
    status.backend = backend.name
    if observed.backend_reason:
        status.backend_reason = observed.backend_reason
    status.replicas = resize.current_size(spec, observed, old)
    # A training that finished under an older operator keeps its status as it was (make test-upgrade).
    finished_before = old.phase in api.FINISHED_PHASES and old.checkpoint_shape is None
    if not finished_before:
        status.selector = resize.selector(target.name)
        checkpoint_home.record(r.result, spec, old)
    status.restarts = r.restarts
    status.attempt = target.attempt
    status.total_epochs = spec.epochs
    status.children = backend.children_names(target.name, target.attempt)
    if observed.output_reason:  # chosen by the operator: kept, so it never changes under the training
        status.output, status.output_reason = dict(api.output_of(spec)), observed.output_reason
    else:
        status.output = status.output_reason = None
    if "managedClaim" in api.output_of(spec):
        status.children["outputClaim"] = builders.output_claim_name(target.name)
    output_durable(status, spec, observed, target.name, now, r.generation)
    r.result.delete += [ref(w) for w in observed.stale]
    force_delete_lost(r.result, observed)
    if r.made_policy:
        status.children["networkPolicy"] = r.made_policy
    return r


def _service_and_network_policy(r: _Round) -> dict[str, Any] | None:
    """The headless Service (where the backend has one) and the NetworkPolicy, which every attempt
    shares; the policy is returned for the first workload to be made after it.

    The training's NetworkPolicy, if it is to have one, is made once, with the first workload and before
    it (plan's creating branch), and then named in status.children; a training that an operator without
    policies started (its status names children, but no policy) gets it in this round. The one the
    operator made is deleted when spec.networkPolicy or the chart's switch turns it off. No watch is
    needed: the policy is owned by the training, and a create of an existing one is a no-op."""
    service = r.observed.backend.build_service(r.spec, r.target)
    if service is not None and r.observed.service is None:
        r.result.create.append(service)
    policy, made = children.build_network_policy(r.spec, r.target), r.made_policy
    if policy is not None:
        if not made and r.old.children:  # started without (a made one is already named: carried over)
            r.result.create.append(policy)
            r.children["networkPolicy"] = policy["metadata"]["name"]
    elif made:
        r.result.delete.append({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "name": made,
                                "namespace": r.target.namespace})
        r.children.pop("networkPolicy", None)
    return policy


def _without_workload(r: _Round, policy: dict[str, Any] | None) -> None:
    """No workload of this attempt: wait for what must go first, end a training out of time, or create
    the workload and what it mounts."""
    status, spec, observed, target = r.status, r.spec, r.observed, r.target
    status.workload_active = False
    if observed.stale:
        phase = (api.RESTARTING if r.old.phase == api.RESTARTING else api.SUSPENDED if spec.suspend
                 else api.QUEUED if target.queued else api.PENDING)
        reason, message = "WaitingForOldAttempt", "waiting for the previous attempt's workload to go away"
    elif (left := deadline_left(spec, status, r.now)) is not None and left <= 0:
        r.phase(*deadline_exceeded(r.result, spec, None, r.now))
        return
    elif _claim_of_another(observed.output_claim, r.meta.get("uid")):
        # A training of the same name was deleted and the garbage collector has yet to take its
        # claim: pods made now would mount a claim about to go (and wait for ever).
        phase = api.RESTARTING if r.old.phase == api.RESTARTING else api.PENDING
        reason = "WaitingForOldClaim"
        message = (f"waiting for the claim {builders.output_claim_name(target.name)} of an earlier "
                   "PetsTraining of this name to be deleted")
        r.result.requeue_after = CHILD_RETRY_MIN_SECONDS
    else:
        phase, reason, message = _create_workload(r, policy, left)
    status.active_replicas = status.ready_replicas = 0
    r.phase(phase, reason, message)


def _create_workload(r: _Round, policy: dict[str, Any] | None, left: float | None) -> tuple[str, str, str]:
    """This attempt's workload, after the children it needs first: the NetworkPolicy (before the first
    pods), the managed output claim and the dataset cache (made once; an existing one is kept)."""
    status, spec, observed, target, result = r.status, r.spec, r.observed, r.target, r.result
    backend = observed.backend
    built_for = replace(target, checkpoint_dir=status.checkpoint_dir, global_batch=status.global_batch)
    if left is not None:
        built_for = replace(built_for, deadline_left=max(1, math.ceil(left)))
    if (size := resize.next_size(spec, status)) != spec.replicas:  # smaller, as the cluster allowed
        built_for = replace(built_for, spec_digest=builders.spec_digest(spec))
    workload = backend.build_workload(replace(spec, replicas=size), built_for)
    status.replicas = size
    if policy is not None and not r.made_policy and policy not in result.create:
        result.create.append(policy)
        r.children["networkPolicy"] = policy["metadata"]["name"]
    claim = children.build_output_claim(spec, target)
    result.create += [c for c in (claim, children.build_dataset_cache_claim(spec, target)) if c is not None]
    if observed.unbound_claims and not builders.created_suspended(spec, target):
        message = waiting_message(observed.unbound_claims)
        if (timed_out := pending_timed_out(result, spec, r.now)) is not None:
            result.create.clear()  # what it would have made first is there: the claims made it wait
            return api.FAILED, "PendingTimeout", f"{timed_out}: {message}"
        poll = poll_after((r.now - parse_timestamp(str(status.pending_since))).total_seconds())
        result.requeue_after = poll if result.requeue_after is None else min(result.requeue_after, poll)
        return (api.RESTARTING if r.restarts else api.PENDING), "WaitingForClaimBinding", message
    if claim is not None and not children.owned(claim) and target.attempt == 0:  # said once, where seen
        result.events.append(Event("Normal", "OutputClaimRetained", (
            f"the claim {claim['metadata']['name']} has retentionPolicy Retain: it stays, with "
            "the work, when this PetsTraining is deleted; delete it with kubectl delete pvc -n "
            f"{target.namespace} {claim['metadata']['name']}")))
    result.create.append(workload)
    status.workload_active = not builders.created_suspended(spec, target)
    reason = "Created"
    message = f"created {workload['kind']} {workload['metadata']['name']}"
    if spec.suspend:
        phase = api.SUSPENDED
    elif target.queued:
        phase, reason = api.QUEUED, "WaitingForAdmission"
        message += f", suspended until Kueue admits it from queue {queue_name(target)}"
    else:
        phase = api.RESTARTING if r.restarts else api.PENDING
    if spec.backend == "auto" and r.old.backend != backend.name:  # a choice: say it
        result.events.append(Event("Normal", "BackendSelected",
                                   f"running as a {backend.kind}: {observed.backend_reason}"))
    result.events.append(Event("Normal", "Created", message))
    return phase, reason, message


def _read_progress(r: _Round, ws: WorkloadState) -> None:
    """The workload's pods, and rank 0's progress as last read, into the status."""
    status, observed = r.status, r.observed
    status.active_replicas, status.ready_replicas = ws.active, ws.ready
    if ws.start_time and not status.start_time:
        status.start_time = ws.start_time
    if observed.progress and not older_than_status(observed.progress_read_at, r.old):
        mirror_progress(status, observed.progress, r.now)
        goodput.read_attempt(status, r.target.attempt, observed.rank0_running_since, observed.progress)
        checkpoints_skipped(r.result, r.old)
        work_lost(r.result, observed.progress.get(gauges.BY_KEY["resume_step"].name))
    elif observed.rank0_running_since:  # listed before its first read: a resize may stop it before then
        goodput.read_attempt(status, r.target.attempt, observed.rank0_running_since, {})


def _with_workload(r: _Round, ws: WorkloadState) -> None:
    """Where a running workload stands: succeeded, out of time, failed (or its rank on a lost node),
    queued, or active; then the conditions that follow, and the TTL once finished."""
    status, spec, observed, target, result, now = r.status, r.spec, r.observed, r.target, r.result, r.now
    assert observed.workload is not None
    phase, reason, message = ws.phase, ws.reason, ws.message
    left = deadline_left(spec, status, now)
    if phase == api.SUCCEEDED:
        status.pending_since = None
        status.completion_time = ws.completion_time or timestamp(now)
        if observed.summary:  # the run may have finished before a progress read: its summary says it
            mirror_summary(status, observed.summary, spec.epochs)
            goodput.read_summary(status, target.attempt, observed.rank0_running_since, observed.summary)
            work_lost(result, observed.summary.get("resume_step"))
            checkpoints_skipped(result, r.old)
        acc = status.eval_accuracy
        message = "training finished" + (f": accuracy {acc:.4f}" if isinstance(acc, float) else "")
        if target.queued:  # it ran, so Kueue admitted it (perhaps between two polls)
            workload = (status.queue or {}).get("workload")
            status.queue = QueueStatus(queue_name(target), True, "", workload).to_dict()
    elif phase == api.FAILED and left is not None and left <= DEADLINE_SLACK_SECONDS:
        # The workload's own deadline (what was left of the training's) ended it: no restart.
        phase, reason, message = deadline_exceeded(result, spec, None, now)
    elif phase == api.FAILED or (lost_current(observed)
                                 and not observed.backend.is_suspended(observed.workload)):
        # A pod on a lost node never ends, so the workload never fails by itself: the attempt has.
        status.pending_since = None
        phase, reason, message = after_failure(result, spec, observed, ws, r.restarts, now)
    elif target.queued:
        phase, reason, message = while_queued(result, spec, observed, ws, target, r.restarts, now,
                                              _while_active)
    else:
        phase, reason, message = _while_active(result, spec, observed, ws, r.restarts, now)
    if left is not None and phase not in api.FINISHED_PHASES:
        phase, reason, message = watch_deadline(result, spec, observed, (phase, reason, message), now)
    r.phase(phase, reason, message)
    progress_reported(result, observed, now, r.generation)
    stalled(result, spec, now, r.generation)
    tracking_status.mirror(status, observed.progress, observed.summary, now, r.generation)
    if phase in api.FINISHED_PHASES:
        _ttl(result, spec, status, now)


def _claim_of_another(claim: dict[str, Any] | None, uid: str | None) -> bool:
    """The output claim exists and goes (being deleted, or owned by a training that is no more). A claim
    with no owner (Retain) is kept work: it is used as it is."""
    if claim is None:
        return False
    meta = claim.get("metadata") or {}
    owners = [o.get("uid") for o in meta.get("ownerReferences") or []]
    return bool(meta.get("deletionTimestamp")) or (bool(owners) and uid not in owners)


def _workload_state(observed: Observed, replicas: int) -> WorkloadState | None:
    """The workload's state (None: there is none), Succeeded as soon as every rank's pod has: the
    workload's own Complete follows, as its controller catches up (a Succeeded pod is never undone, so
    the training's result cannot change)."""
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


def _built_from_older_spec(workload: dict[str, Any], spec: Spec) -> bool:
    """The workload was built from a spec since edited (while it was suspended or queued). A workload
    from before the annotation existed is taken as current."""
    built_from = ((workload.get("metadata") or {}).get("annotations") or {}).get(api.ANNOTATION_SPEC_DIGEST)
    return bool(built_from) and built_from != builders.spec_digest(spec)


def _smaller(r: _Round, ws: WorkloadState) -> tuple[int, str, str] | None:
    """The cluster has room for fewer pods than the workload's, and spec.elastic allows going on with
    them (resize.py): the size, the reason and why."""
    size = resize.built_size(r.observed.workload or {}) or r.size
    if (admitted := resize.admitted_smaller(r.spec, r.observed, r.status)) is not None:
        return admitted, PARTIAL_ADMISSION, (f"Kueue admitted {admitted} of the {size} pods the workload's "
                                             f"pods were built for; rebuilt at world size {admitted}")
    waiting = r.old.phase in (api.PENDING, api.RESTARTING)
    if r.target.queued or not waiting or r.observed.backend.is_suspended(r.observed.workload or {}):
        return None
    if (placed := resize.placed_after_node_loss(r.spec, r.observed, r.status, size, r.now)) is not None:
        seconds = r.spec.placement.get("nodeLostSeconds", 30)
        return placed, NODE_LOST, (f"after a node was lost only {placed} of {size} pods were placed within "
                                   f"spec.placement.nodeLostSeconds={seconds}; going on at {placed} "
                                   f"(spec.elastic.minReplicas={resize.min_replicas(r.spec)}) until this "
                                   "attempt ends or spec.replicas changes")
    return None


def _rebuild(r: _Round, smaller: tuple[int, str, str] | None = None) -> None:
    """No edit is lost: a workload built from an older spec is replaced by one built from this spec, as a
    new attempt that is not a restart (nothing failed). Checkpoints carry over where their shape allows
    (`builders.checkpoint_dir`). `smaller`: the cluster has room for fewer pods (resize.py), and the
    workload is rebuilt at that size for the same spec."""
    status, spec, observed, target, result, now = r.status, r.spec, r.observed, r.target, r.result, r.now
    assert observed.workload is not None
    old_size = int(resize.built_size(observed.workload) or observed.backend.size(observed.workload)
                   or spec.replicas)
    active = bool(status.workload_active)
    # The workload goes (its pods stop with the SIGTERM save), and the next attempt is made once it is gone.
    status.attempt = target.attempt + 1
    policy = {k: v for k, v in (status.children or {}).items() if k == "networkPolicy"}  # one for all
    status.children = observed.backend.children_names(target.name, target.attempt + 1) | policy
    result.delete.append(ref(observed.workload))
    result.requeue_after = 0.0
    status.workload_active = False
    if smaller is not None:
        size, reason, why = smaller
        resize.begin(result, old_size, size, spec.replicas, reason, why, now)
        r.phase(api.QUEUED if target.queued else api.PENDING, "Resizing",
                f"resizing {old_size} -> {size}: {why}")
        return
    if old_size != spec.replicas:
        if active and not spec.suspend:
            resize.begin(result, old_size, spec.replicas, spec.replicas, SCALED,
                         resize.scaled_message(old_size, spec.replicas, False), now)
        else:
            status.resize = None
            result.events.append(Event("Normal", "Resized", f"{old_size} -> {spec.replicas} ({SCALED}): "
                                       + resize.scaled_message(old_size, spec.replicas, True)))
    kind, name = observed.workload["kind"], observed.workload["metadata"]["name"]
    message = (f"spec changed (generation {r.generation}) since {kind} {name} was built: "
               "rebuilding it from the new spec")
    if active and spec.suspend:  # edited as it was being suspended
        message += "; its pods stop now, and the rebuilt workload starts on resume"
    elif active:
        message += "; its pods restart from the newest checkpoint of this shape (not counted as a restart)"
    result.events.append(Event("Normal", "Rebuilding", message))
    phase = (api.SUSPENDED if spec.suspend else api.QUEUED if target.queued
             else api.RESTARTING if r.old.phase == api.RESTARTING else api.PENDING)
    r.phase(phase, "Rebuilding", message)


def _while_active(result: Plan, spec: Spec, observed: Observed, ws: WorkloadState,
                  restarts: int, now: datetime) -> tuple[str, str, str]:
    """Not finished: suspend or resume, or say what the pods are doing."""
    status = result.status
    assert observed.workload is not None
    phase, reason, message = ws.phase, ws.reason, ws.message
    # Suspend / resume go through the workload's own suspend field.
    if observed.backend.is_suspended(observed.workload) != bool(spec.suspend):
        result.suspend = bool(spec.suspend)
        result.suspend_workload = observed.workload["metadata"]["name"]
        status.pending_since = None
        phase, reason, message = ((api.SUSPENDED, "Suspending", "suspending the training") if spec.suspend
                                  else (api.PENDING, "Resuming", "resuming the training"))
        result.events.append(Event("Normal", "Suspended" if spec.suspend else "Resumed", message))
        return phase, reason, message
    # The workload's count says pods exist; only the pods say whether they run. With no pod visible
    # yet (just created), the workload's own view stands, unless the API server refused to create them.
    if phase != api.SUSPENDED and (observed.pods or observed.workload_refusals):
        phase, reason, message = _from_pods(result, spec, observed)
    if phase in (api.SUSPENDED, api.RUNNING):  # not waiting
        status.pending_since = None
        return phase, reason, message
    if (timed_out := pending_timed_out(result, spec, now)) is not None:
        result.delete.append(ref(observed.workload))
        return api.FAILED, "PendingTimeout", f"{timed_out}: {message}"
    return (api.RESTARTING if restarts else api.PENDING), reason, message



def _from_pods(result: Plan, spec: Spec, observed: Observed) -> tuple[str, str, str]:
    replicas = int(result.status.replicas or spec.replicas)  # the size this attempt runs at
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
    old_reason = next((c.get("reason") for c in result.status.conditions or []
                       if c["type"] == "Progressing"), None)
    routine = ("FetchingDataset", "ContainerCreating", "WaitingForPods")  # said in status, no Warning
    if why.reason != old_reason and why.reason not in routine:
        result.events.append(Event("Warning", why.reason, message))  # one per new reason, not per poll
    return api.PENDING, why.reason, message


def _ttl(result: Plan, spec: Spec, status: Status, now: datetime) -> None:
    ttl = spec.ttl_seconds_after_finished
    done = status.completion_time
    if ttl is None or not done:
        return
    if (left := (parse_timestamp(done) - now).total_seconds() + ttl) <= 0:
        result.delete_self = True
    else:
        result.requeue_after = left


