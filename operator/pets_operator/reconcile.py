"""One round for one training, run in a worker thread: observe (the snapshot, and the reads a round makes
only when needed) -> status.plan() -> act. The backend and the output of a training are chosen here
once, by their policies, and kept in its status."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf

from pets_operator import (
    api,
    backends,
    builders,
    children,
    claim_binding,
    metrics,
    observe,
    output_durability,
    pods,
    status,
)
from pets_operator.act import POLL_IDLE, Logger, carry_out
from pets_operator.backends import parse_timestamp
from pets_operator.cluster import (
    Cluster,
    has_default_storage_class,
    owned_by,
    served_backends,
    storage_classes,
)
from pets_operator.context import Context, Snapshot
from pets_operator.plan_types import Observed
from pets_operator.refusals import plan_backend_unavailable, plan_invalid
from pets_operator.status_types import Status

# A workload deleting for longer than this is deleted again: its end may have been missed (Context.gone).
DELETING_RECHECK = timedelta(seconds=30)
LEGACY_FINALIZER = f"{api.GROUP}/operator"  # kopf's, from when each training had a daemon



def _resolve_output(ctx: Context, old_status: Status) -> tuple[dict[str, Any], str]:
    return output_durability.keep_or_choose_output(old_status, ctx.settings.default_output,
                                                   lambda: has_default_storage_class(ctx.api_client))


def reconcile_once(ctx: Context, snap: Snapshot, logger: Logger) -> float | None:
    """One observe -> plan -> act round over a snapshot. Returns seconds until the next round at the
    latest (None: none needed, the training is gone or its spec cannot run)."""
    body = snap.body
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    key = (namespace, name)
    cl = Cluster(ctx.api_client, namespace, name)
    meta = body["metadata"]
    if LEGACY_FINALIZER in (meta.get("finalizers") or []):
        cl.remove_finalizer(LEGACY_FINALIZER, meta["finalizers"], meta["resourceVersion"])
        logger.info(f"removed the finalizer {LEGACY_FINALIZER} (no longer used)")
    if body["metadata"].get("deletionTimestamp"):
        return None  # the garbage collector deletes the children (owner references)
    now = datetime.now(UTC)
    old_status = Status.from_dict(body.get("status") or {})
    try:
        spec = api.resolve_spec(body.get("spec"))
        backend, backend_reason = backends.keep_or_choose(
            spec, old_status, lambda: served_backends(ctx.api_client), ctx.settings.auto_backend)
        output_reason = ""
        if spec.output is None:
            output, output_reason = _resolve_output(ctx, old_status)
            spec = dataclasses.replace(spec, output=output)
    except backends.BackendUnavailable as exc:  # the CRD may be installed later: look again
        delay = carry_out(ctx, cl, body, plan_backend_unavailable(body, str(exc), now), logger)
        return POLL_IDLE if delay is None else min(delay, POLL_IDLE)
    except api.SpecError as exc:  # Failed; a new spec (a training event) wakes it again
        metrics.ERRORS.labels(kind="permanent").inc()
        # None once written; the seconds until a write held back by STATUS_WRITE_INTERVAL may go
        return carry_out(ctx, cl, body, plan_invalid(body, str(exc), now), logger)

    restarts = int(old_status.restarts or 0)
    # before `attempt` existed, one per restart
    attempt = int(restarts if old_status.attempt is None else old_status.attempt)
    current_name = builders.job_name(name, attempt)
    uid = body["metadata"]["uid"]
    watched = backend is backends.JOB
    listed = snap.jobs if watched else cl.workloads(backend)
    current, stale = None, []
    for w in listed:
        if not owned_by(w, uid):
            continue  # same label, another owner: not ours to touch
        w = w if "kind" in w else w | {"apiVersion": backend.api_version, "kind": backend.kind}
        if w["metadata"]["name"] == current_name and not w["metadata"].get("deletionTimestamp"):
            current = w
        else:
            stale.append(w)
    # Workloads already being deleted need no second delete, but still block the next attempt; one still
    # deleting after DELETING_RECHECK is asked again, so that an index that missed its end learns it (404).
    deleting = {w["metadata"]["name"] for w in stale if w["metadata"].get("deletionTimestamp")
                and now - parse_timestamp(w["metadata"]["deletionTimestamp"]) < DELETING_RECHECK}

    service = next((s for s in snap.services if s["metadata"]["name"] == builders.service_name(name)), None) \
        if backend.uses_service else None
    if service is not None and not owned_by(service, uid):
        raise kopf.TemporaryError(
            f"Service {namespace}/{service['metadata']['name']} exists and is not owned by this "
            "PetsTraining; delete or rename it", delay=POLL_IDLE)

    def pods_of(workload: str) -> list[dict[str, Any]]:
        selector = backend.pods_selector(workload)
        return [p for p in snap.pods if observe.labels_match(p["metadata"].get("labels") or {}, selector)]

    settings = ctx.settings
    target = builders.Target(name, namespace, attempt, settings.default_image, settings.cluster_domain,
                             builders.queue_labels(body["metadata"].get("labels")),
                             network_policy=settings.network_policy, uid=str(uid or ""))
    state = None
    rank0 = observe.Rank0()
    pod_list: list[dict[str, Any]] | None = None
    warnings: dict[str, list[dict[str, Any]]] = {}
    refusals: list[dict[str, Any]] = []
    queue_served, queue_workload = True, None
    output_claim: dict[str, Any] | None = None
    unbound_claims: dict[str, str] = {}
    if current is None and not stale:  # about to make the workload: the claims it mounts, bound?
        wanted = [c for c in (children.build_output_claim(spec, target),
                              children.build_dataset_cache_claim(spec, target)) if c is not None]
        found = {c["metadata"]["name"]: cl.claim(c["metadata"]["name"]) for c in wanted}
        output_claim = found.get(builders.output_claim_name(name))  # not an old training's?
        if any(claim_binding.pending(c) for c in found.values()):
            unbound_claims = claim_binding.unbound_immediate(wanted, found, storage_classes(ctx.api_client))
    if current is not None:
        if target.queued:
            queue_served, queue_workload = cl.queue_workload(current)
        state = backend.state(current, spec.replicas)
        pod_list = pods_of(current["metadata"]["name"])
        rank0 = observe.observe_rank0(observe.newest_rank0(backend, pod_list), state.phase, ctx.scraper, key)
        if state.phase not in api.FINISHED_PHASES:
            warnings = cl.pod_warnings([p["metadata"]["name"] for p in pod_list
                                        if observe.creating_long(p, now)])
            if observe.pods_missing_long(current, pod_list, spec.replicas, backend, now):
                refusals = cl.workload_refusals(current["kind"], current["metadata"]["name"])
            if (claim_name := builders.output_claim(spec, name)) and any(not pods.scheduled_at(p)
                                                                         for p in pod_list):
                output_claim = cl.claim(claim_name)  # a pod waits to be scheduled: on its claim?

    candidates = observe.lost_candidates([*(pod_list or []), *(p for w in deleting for p in pods_of(w))])
    lost_pods, lost_nodes = observe.lost_pods(cl, candidates)
    observed = Observed(backend=backend, backend_reason=backend_reason, workload=current, stale=stale,
                        service=service, state=state, pods=pod_list, pod_events=warnings,
                        workload_refusals=refusals, queue_workload=queue_workload, queue_served=queue_served,
                        lost_pods=lost_pods, lost_nodes=lost_nodes, output_reason=output_reason,
                        output_claim=output_claim, unbound_claims=unbound_claims, ended_runs=snap.ended,
                        **vars(rank0))
    result = status.plan(body, spec, observed, target, now, old_status)
    result.delete = [r for r in result.delete if r["name"] not in deleting]
    delay = carry_out(ctx, cl, body, result, logger, restarts=restarts, watched=watched)
    if delay is not None and len(candidates) > len(lost_pods):
        # a pod stuck terminating: is its node lost by now?
        delay = min(delay, ctx.settings.progress_interval)
    return delay

