"""The planner: one Round (spec, stored status, what was observed, target, time) -> a Plan.

A Plan says what status to write, which Kubernetes objects to create or delete, and which Events to
emit. `reconcile.py` snapshots the cluster into a Round, calls `plan()`, and `act.py` carries the Plan
out; they decide nothing themselves. Every decision is a policy here or in the modules it calls, each
reading the round (`policy(r, plan)`). Everything is deterministic given the round (time is in it).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from pets_operator import (
    api,
    builders,
    checkpoint_home,
    children,
    claim_binding,
    deadlines,
    goodput,
    mirror,
    pacing,
    queueing,
    refusals,
    resize,
    restarts,
    shared_children,
    stall,
    tracking_status,
    ttl,
    workload_phase,
)
from pets_operator.conditions import apply_phase
from pets_operator.ended_runs import book as book_ended_runs
from pets_operator.output_durability import output_durable
from pets_operator.plan_types import Event, Plan, Round, ref
from pets_operator.timestamps import timestamp


def plan(r: Round) -> Plan:
    """Decide the next step for one PetsTraining: `_decide`, older attempts' workloads that are being
    deleted not deleted again (unless it has taken too long: reconcile.DELETING_RECHECK), and `pacing`.

    A round whose spec or backend cannot run, one whose Service is someone else's, and one whose child the
    API server refused plan only that (`refusals`, `shared_children`)."""
    if r.spec_error is not None or r.backend_error is not None:
        result = refusals.unplannable(r)
    elif (conflict := shared_children.service_conflict(r)) is not None:
        result = Plan(status=r.old.copy(), conflict=conflict, next_round=pacing.POLL_IDLE)
        return result
    else:
        result = _decide(r)
        result.delete = [d for d in result.delete if d["name"] not in r.observed.deleting]
        if r.refused is not None:
            result = refusals.child_refused(r, result)
    result.restarted = result.status.phase == api.RESTARTING and (result.status.restarts or 0) > r.restarts
    pacing.pace(r, result)
    return result


def _decide(r: Round) -> Plan:
    """The round, step by step:

    1. `_begin`: the fields every round writes, the output and its durability, older attempts cleaned up;
    2. a finished training keeps only its TTL;
    3. `shared_children`: the children every attempt shares;
    4. without a workload: `_without_workload` waits or creates one;
    5. with one built from an edited spec, or too big for the cluster: `resize.rebuild`;
    6. with one: `mirror.progress`, then `_with_workload` says where it stands;
    7. goodput accounts the round's time."""
    result = _begin(r)
    status = result.status
    if r.old.phase in api.FINISHED_PHASES:  # terminal: nothing is created again, only the TTL remains
        status.workload_active = False
        ttl.after_finished(r, result)
    else:
        goodput.begin(status, r.created, r.now)
        book_ended_runs(status, r.observed.ended_runs)  # before this round's reads: they are older runs
        policy = shared_children.service_and_network_policy(r, result)
        r = replace(r, state=workload_phase.state(r, result))
        if r.state is None:
            _without_workload(r, result, policy)
        else:
            status.workload_active = (not r.observed.backend.is_suspended(r.observed.workload or {})
                                      and r.state.phase not in api.FINISHED_PHASES)
            if resize.rebuild(r, result):
                apply_phase(r, result)
            else:
                _read_progress(r, result)
                _with_workload(r, result)
    resize.settle(r, result)
    goodput.account(r.old, status, r.created, r.now)
    return result


def _begin(r: Round) -> Plan:
    """The fields every round writes, the output and its durability; older attempts' workloads are always
    cleaned up (a restart deletes, then recreates), and pods stuck on a lost node force-deleted."""
    spec, observed, target, old = r.spec, r.observed, r.target, r.old
    result = Plan(status=old.copy())
    status = result.status
    backend = observed.backend
    status.observed_generation = r.generation
    status.backend = backend.name
    if observed.backend_reason:
        status.backend_reason = observed.backend_reason
    status.replicas = resize.current_size(r)
    # A training that finished under an older operator keeps its status as it was (make test-upgrade).
    finished_before = old.phase in api.FINISHED_PHASES and old.checkpoint_shape is None
    if not finished_before:
        status.selector = resize.selector(r)
        checkpoint_home.record(r, result)
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
    output_durable(r, result)
    result.delete += [ref(w) for w in observed.stale]
    restarts.force_delete_lost(r, result)
    if made := shared_children.made_network_policy(r):
        status.children["networkPolicy"] = made
    return result


def _without_workload(r: Round, result: Plan, policy: dict[str, Any] | None) -> None:
    """No workload of this attempt: wait for what must go first, end a training out of time, or create
    the workload and what it mounts."""
    status, spec, observed, target = result.status, r.spec, r.observed, r.target
    status.workload_active = False
    if observed.stale:
        phase = (api.RESTARTING if r.old.phase == api.RESTARTING else api.SUSPENDED if spec.suspend
                 else api.QUEUED if target.queued else api.PENDING)
        result.verdict = (phase, "WaitingForOldAttempt",
                          "waiting for the previous attempt's workload to go away")
    elif (left := deadlines.deadline_left(r, result)) is not None and left <= 0:
        deadlines.exceeded(r, result)
        apply_phase(r, result)
        return
    elif (why := shared_children.claim_of_another(r)) is not None:
        # A training of the same name was deleted and the garbage collector has yet to take its claim.
        phase = api.RESTARTING if r.old.phase == api.RESTARTING else api.PENDING
        result.verdict = (phase, "WaitingForOldClaim", why)
        result.requeue_after = refusals.CHILD_RETRY_MIN_SECONDS
    else:
        _create_workload(r, result, policy, left)
    status.active_replicas = status.ready_replicas = 0
    apply_phase(r, result)


def _create_workload(r: Round, result: Plan, policy: dict[str, Any] | None, left: float | None) -> None:
    """This attempt's workload, after the children it needs first: the NetworkPolicy (before the first
    pods), the managed output claim and the dataset cache (made once; an existing one is kept)."""
    status, spec, observed, target = result.status, r.spec, r.observed, r.target
    backend = observed.backend
    built_for = replace(target, checkpoint_dir=status.checkpoint_dir, global_batch=status.global_batch)
    if left is not None:
        built_for = replace(built_for, deadline_left=max(1, math.ceil(left)))
    if (size := resize.next_size(r)) != spec.replicas:  # smaller, as the cluster allowed
        built_for = replace(built_for, spec_digest=builders.spec_digest(spec))
    workload = backend.build_workload(replace(spec, replicas=size), built_for)
    status.replicas = size
    if policy is not None and not shared_children.made_network_policy(r) and policy not in result.create:
        result.create.append(policy)
        status.children = (status.children or {}) | {"networkPolicy": policy["metadata"]["name"]}
    claim = children.build_output_claim(spec, target)
    result.create += [c for c in (claim, children.build_dataset_cache_claim(spec, target)) if c is not None]
    if (waiting := claim_binding.waiting(r, result)) is not None:
        result.verdict = waiting
        return
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
        message += f", suspended until Kueue admits it from queue {queueing.queue_name(r)}"
    else:
        phase = api.RESTARTING if r.restarts else api.PENDING
    if spec.backend == "auto" and r.old.backend != backend.name:  # a choice: say it
        result.events.append(Event("Normal", "BackendSelected",
                                   f"running as a {backend.kind}: {observed.backend_reason}"))
    result.events.append(Event("Normal", "Created", message))
    result.verdict = (phase, reason, message)


def _read_progress(r: Round, result: Plan) -> None:
    """The workload's pods, and rank 0's progress as last read, into the status."""
    status, ws = result.status, r.state
    assert ws is not None
    status.active_replicas, status.ready_replicas = ws.active, ws.ready
    if ws.start_time and not status.start_time:
        status.start_time = ws.start_time
    mirror.progress(r, result)


def _with_workload(r: Round, result: Plan) -> None:
    """Where a running workload stands: succeeded, out of time, failed (or its rank on a lost node),
    queued, or active; then the conditions that follow, and the TTL once finished."""
    status, observed, ws = result.status, r.observed, r.state
    assert observed.workload is not None and ws is not None
    left = deadlines.deadline_left(r, result)
    if ws.phase == api.SUCCEEDED:
        status.pending_since = None
        status.completion_time = ws.completion_time or timestamp(r.now)
        mirror.summary(r, result)  # the run may have finished before a progress read: its summary says it
        acc = status.eval_accuracy
        result.verdict = (ws.phase, ws.reason,
                          "training finished" + (f": accuracy {acc:.4f}" if isinstance(acc, float) else ""))
        queueing.ran(r, result)
    elif ws.phase == api.FAILED and left is not None and left <= deadlines.DEADLINE_SLACK_SECONDS:
        deadlines.exceeded(r, result)  # its own deadline (what was left of the training's) ended it
    elif ws.phase == api.FAILED or (restarts.lost_current(r)
                                    and not observed.backend.is_suspended(observed.workload)):
        # A pod on a lost node never ends, so the workload never fails by itself: the attempt has.
        status.pending_since = None
        result.verdict = restarts.after_failure(r, result)
    else:
        queued = queueing.while_queued(r, result) if r.target.queued else None
        result.verdict = queued or workload_phase.while_active(r, result)
    assert result.verdict is not None
    if left is not None and result.verdict[0] not in api.FINISHED_PHASES:
        deadlines.watch_deadline(r, result)
    apply_phase(r, result)
    stall.progress_reported(r, result)
    stall.stalled(r, result)
    tracking_status.mirror(r, result)
    if status.phase in api.FINISHED_PHASES:
        ttl.after_finished(r, result)
