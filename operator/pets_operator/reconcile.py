"""One round for one training, run in a worker thread: snapshot (the watched objects, and the reads a
round makes only when needed) into a Round -> plan.plan() -> act. It decides nothing: the backend and
the output of a training are chosen by their own functions, once, and kept in its status."""

from __future__ import annotations

import dataclasses
import math
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from pets_operator import api, backends, builders, children, metrics, observe, plan, pods
from pets_operator.act import Logger, carry_out
from pets_operator.backends import Backend
from pets_operator.cluster import Cluster, has_default_storage_class, served_backends, storage_classes
from pets_operator.context import Context, Snapshot
from pets_operator.plan_types import Observed, Round
from pets_operator.spec import Spec
from pets_operator.status_types import Status
from pets_operator.timestamps import parse_timestamp

# A workload deleting for longer than this is deleted again: its end may have been missed (Context.gone).
DELETING_RECHECK = timedelta(seconds=30)
LEGACY_FINALIZER = f"{api.GROUP}/operator"  # kopf's, from when each training had a daemon


def reconcile_once(ctx: Context, snap: Snapshot, logger: Logger) -> float | None:
    """One snapshot -> plan -> act round. Returns seconds until the next round at the latest (None: none
    needed, the training is gone or its spec cannot run)."""
    body = snap.body
    meta = body["metadata"]
    cl = Cluster(ctx.api_client, meta["namespace"], meta["name"])
    if LEGACY_FINALIZER in (meta.get("finalizers") or []):
        cl.remove_finalizer(LEGACY_FINALIZER, meta["finalizers"], meta["resourceVersion"])
        logger.info(f"removed the finalizer {LEGACY_FINALIZER} (no longer used)")
    if meta.get("deletionTimestamp"):
        return None  # the garbage collector deletes the children (owner references)
    return plan_and_act(ctx, cl, body, snapshot(ctx, cl, snap), logger)


def plan_and_act(ctx: Context, cl: Cluster, body: dict[str, Any], r: Round, logger: Logger) -> float | None:
    """Plan the round and carry the Plan out; a child the API server refused is planned for (the round
    again, with the refusal), and that Plan carried out. Returns when the next round is due."""
    result = plan.plan(r)
    if (refused := carry_out(ctx, cl, body, result, logger)) is not None:
        result = plan.plan(dataclasses.replace(r, refused=refused))
        carry_out(ctx, cl, body, result, logger)
    return result.next_round


def _resolve_output(ctx: Context, old_status: Status) -> tuple[dict[str, Any], str]:
    return children.keep_or_choose_output(old_status, ctx.settings.default_output,
                                          lambda: has_default_storage_class(ctx.api_client))


def snapshot(ctx: Context, cl: Cluster, snap: Snapshot) -> Round:
    """The round of one training: its spec resolved (the backend and the output chosen once, then kept in
    the status), and what is there."""
    body, now, settings = snap.body, datetime.now(UTC), ctx.settings
    old = Status.from_dict(body.get("status") or {})
    meta = body["metadata"]
    target = builders.Target(meta["name"], meta["namespace"], old.current_attempt, settings.default_image,
                             settings.cluster_domain, builders.queue_labels(meta.get("labels")),
                             network_policy=settings.network_policy, uid=str(meta["uid"] or ""))
    nothing = Observed(backends.JOB, None)
    spec = None
    try:
        spec = api.resolve_spec(body.get("spec"))
        backend, backend_reason = backends.keep_or_choose(
            spec, old, lambda: served_backends(ctx.api_client), settings.auto_backend)
        output_reason = ""
        if spec.output is None:
            output, output_reason = _resolve_output(ctx, old)
            spec = dataclasses.replace(spec, output=output)
    except backends.BackendUnavailable as exc:
        return _round(ctx, cl, body, spec, nothing, target, now, backend_error=str(exc))
    except api.SpecError as exc:  # Failed; a new spec (a training event) wakes it again
        metrics.ERRORS.labels(kind="permanent").inc()
        return _round(ctx, cl, body, None, nothing, target, now, spec_error=str(exc))
    observed = _observe(ctx, cl, snap, spec, target, backend, now)
    observed = dataclasses.replace(observed, backend_reason=backend_reason, output_reason=output_reason)
    return _round(ctx, cl, body, spec, observed, target, now)


def _round(ctx: Context, cl: Cluster, body: dict[str, Any], spec: Spec | None, observed: Observed,
           target: builders.Target, now: datetime, **error: str) -> Round:
    since = time.monotonic() - ctx.status_written.get(cl.key, -math.inf)
    return Round.of(body, spec, observed, target, now, progress_interval=ctx.settings.progress_interval,
                    written_ago=since, **error)


def _observe(ctx: Context, cl: Cluster, snap: Snapshot, spec: Spec, target: builders.Target,
             backend: Backend, now: datetime) -> Observed:
    """What is there: this attempt's workload and the older ones, the Service, this attempt's pods and
    what they say, and the reads made only when needed (a claim, a pod's Events, a Node)."""
    current, stale, deleting = _workloads(cl, snap, target, backend, now)
    service = next((s for s in snap.services if s["metadata"]["name"] == builders.service_name(target.name)),
                   None) if backend.uses_service else None
    foreign = None if service is None or children.owned_by(service, target.uid) else service

    def pods_of(workload: str) -> list[dict[str, Any]]:
        selector = backend.pods_selector(workload)
        return [p for p in snap.pods if observe.labels_match(p["metadata"].get("labels") or {}, selector)]

    seen: dict[str, Any] = {}
    if current is None and not stale:  # about to make the workload: the claims it mounts, bound?
        seen = _claims(ctx, cl, spec, target)
    elif current is not None:
        seen = _current(ctx, cl, spec, target, backend, current, pods_of(current["metadata"]["name"]), now)
    candidates = observe.lost_candidates([*(seen.get("pods") or []),
                                          *(p for w in deleting for p in pods_of(w))])
    lost_pods, lost_nodes = observe.lost_pods(cl, candidates)
    return Observed(backend=backend, workload=current, stale=stale, service=None if foreign else service,
                    foreign_service=foreign, lost_pods=lost_pods,
                    lost_nodes=lost_nodes, stuck_pods=len(candidates) - len(lost_pods),
                    deleting=frozenset(deleting), ended_runs=snap.ended, **seen)


def _workloads(cl: Cluster, snap: Snapshot, target: builders.Target, backend: Backend, now: datetime
               ) -> tuple[dict[str, Any] | None, list[dict[str, Any]], set[str]]:
    """This attempt's workload (None: not made, or being deleted), the older ones, and those of them being
    deleted: they need no second delete, but still block the next attempt; one still deleting after
    DELETING_RECHECK is asked again, so that an index that missed its end learns it (404)."""
    current_name = builders.job_name(target.name, target.attempt)
    listed = snap.jobs if backend is backends.JOB else cl.workloads(backend)
    current, stale = None, []
    for w in listed:
        if not children.owned_by(w, target.uid):
            continue  # same label, another owner: not ours to touch
        w = w if "kind" in w else w | {"apiVersion": backend.api_version, "kind": backend.kind}
        if w["metadata"]["name"] == current_name and not w["metadata"].get("deletionTimestamp"):
            current = w
        else:
            stale.append(w)
    deleting = {w["metadata"]["name"] for w in stale if w["metadata"].get("deletionTimestamp")
                and now - parse_timestamp(w["metadata"]["deletionTimestamp"]) < DELETING_RECHECK}
    return current, stale, deleting


def _claims(ctx: Context, cl: Cluster, spec: Spec, target: builders.Target) -> dict[str, Any]:
    """The claims the workload about to be made mounts, as they are, and the StorageClasses where one is
    not bound yet."""
    wanted = [c for c in (children.build_output_claim(spec, target),
                          children.build_dataset_cache_claim(spec, target)) if c is not None]
    claims = {c["metadata"]["name"]: cl.claim(c["metadata"]["name"]) for c in wanted}
    classes = None if all(children.bound(c) for c in claims.values()) else storage_classes(ctx.api_client)
    return {"claims": claims, "storage_classes": classes,
            "output_claim": claims.get(builders.output_claim_name(target.name))}


def _current(ctx: Context, cl: Cluster, spec: Spec, target: builders.Target, backend: Backend,
             current: dict[str, Any], pod_list: list[dict[str, Any]], now: datetime) -> dict[str, Any]:
    """This attempt's workload: its state and pods, rank 0's progress, and while it has not ended, the
    reads its pods ask for (their Events, the workload's refusals, the output claim)."""
    seen: dict[str, Any] = {"pods": pod_list}
    if target.queued:
        seen["queue_served"], seen["queue_workload"] = cl.queue_workload(current)
    state = seen["state"] = backend.state(current, spec.replicas)
    rank0 = observe.observe_rank0(observe.newest_rank0(backend, pod_list), state.phase, ctx.scraper, cl.key)
    seen |= vars(rank0)
    if state.phase in api.FINISHED_PHASES:
        return seen
    seen["pod_events"] = cl.pod_warnings([p["metadata"]["name"] for p in pod_list
                                          if observe.creating_long(p, now)])
    if observe.pods_missing_long(current, pod_list, spec.replicas, backend, now):
        seen["workload_refusals"] = cl.workload_refusals(current["kind"], current["metadata"]["name"])
    if (claim_name := builders.output_claim(spec, target.name)) and any(not pods.scheduled_at(p)
                                                                       for p in pod_list):
        seen["output_claim"] = cl.claim(claim_name)  # a pod waits to be scheduled: on its claim?
    return seen
