"""Acting on a Plan: children created first, then the status, deletions last; a child the API server
refuses turned into the training's own Plan; status writes within a phase held back; and when the next
round is due."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

import kopf
from kubernetes.client.exceptions import ApiException

from pets_operator import api, backends, children, metrics, plan_types
from pets_operator.cluster import Cluster, api_message, child_refusal_permanent
from pets_operator.observe import Key, kept
from pets_operator.refusals import plan_child_refused

if TYPE_CHECKING:
    from pets_operator.context import Context

Logger = logging.Logger | logging.LoggerAdapter[Any]
POLL_IDLE = 30.0  # waiting for something that is not watched: a backend's CRD, Kueue's Workload
RESYNC = 600.0  # a training whose children are all watched: a safety net, read from the indices
STATUS_WRITE_INTERVAL = 10.0  # seconds between two status writes of a training within one phase


def child_refused(cl: Cluster, body: dict[str, Any], result: plan_types.Plan, manifest: dict[str, Any],
                   made: list[dict[str, Any]], exc: ApiException, logger: Logger) -> plan_types.Plan:
    """The Plan once the API server refused to create `manifest` (`made`: created before it)."""
    permanent = child_refusal_permanent(exc)
    child = f"{manifest['kind']} {manifest['metadata']['name']}"
    message = api_message(exc)
    metrics.ERRORS.labels(kind=f"api_{exc.status}").inc()
    logger.warning(f"the API server refused {child} (HTTP {exc.status}, "
                   f"{'permanent' if permanent else 'will retry'}): {message}")
    # If it fails: what this round made, our Service (maybe made by an earlier round; reconcile_once
    # checked it is ours), and what the Plan meant to delete anyway (older attempts' workloads).
    # Not a claim it made: the operator may not delete claims; the training's owner reference takes it.
    cleanup = [m for m in made if m["kind"] != "PersistentVolumeClaim"]
    service = (result.status.children or {}).get("service")
    if service and not any(m["kind"] == "Service" for m in made) and manifest["kind"] != "Service":
        cleanup.append({"apiVersion": "v1", "kind": "Service",
                        "metadata": {"name": service, "namespace": cl.namespace}})
    cleanup += [{"apiVersion": r["apiVersion"], "kind": r["kind"],
                 "metadata": {"name": r["name"], "namespace": r["namespace"]}} for r in result.delete]
    return plan_child_refused(body, message, datetime.now(UTC), permanent, child=child, cleanup=cleanup)


def carry_out(ctx: Context, cl: Cluster, body: dict[str, Any], result: plan_types.Plan, logger: Logger,
               restarts: int = 0, watched: bool = True) -> float | None:
    """Act on a Plan; returns seconds until the next round (None: the training is gone)."""
    # Children first (creation is idempotent by name, so a crash before the status write is harmless);
    # then the status; deletions last: a restart's new attempt number must be stored before the old
    # workload goes, or a crash in between could restart the same attempt twice.
    kbody = cast(kopf.Body, body)
    old_status = body.get("status") or {}
    new_status = result.status.to_dict()
    if (wait := status_write_wait(ctx, cl.key, result, new_status, old_status)) is not None:
        return wait  # the whole round again then (its Events too: they are made against the stored status)
    refused: plan_types.Plan | None = None
    made: list[dict[str, Any]] = []
    for manifest in result.create:
        if children.owned(manifest):
            kopf.adopt(manifest, owner=kbody)
        try:
            created = cl.create(manifest)
        except ApiException as exc:  # refused: the training ends (Failed) or waits, saying why
            refused = child_refused(cl, body, result, manifest, made, exc, logger)
            break
        if created is not None:
            child = (manifest["kind"], manifest["metadata"]["name"])
            ctx.created.setdefault(cl.key, {})[child] = kept(created)
            made.append(manifest)
            logger.info(f"created {manifest['kind']} {manifest['metadata']['name']}")
        else:
            logger.info(f"{manifest['kind']} {manifest['metadata']['name']} already exists; not recreated")
    if refused is not None:
        result, new_status = refused, refused.status.to_dict()
    if new_status != old_status:
        ctx.written[cl.key] = kept(cl.patch_status(plan_types.merge_patch(old_status, new_status)))
        ctx.status_written[cl.key] = time.monotonic()
    # Pods on lost nodes go after the status write too: the attempt they fail is recorded (restarted)
    # first, so a crash in between never leaves a running workload short of a pod it would replace.
    for pod in result.force_delete:
        logger.warning(f"force-deleting pod {pod['name']}: its node is lost")
        if not cl.force_delete_pod(pod["name"], pod.get("uid") or None):
            ctx.gone_now("Pod", cl.namespace, pod["name"])
    for ref in result.delete:
        logger.info(f"deleting {ref['kind']} {ref['name']} (previous attempt)")
        if not cl.delete(ref):
            ctx.gone_now(ref["kind"], ref["namespace"], ref["name"])
    if result.suspend is not None and result.suspend_workload:
        cl.set_suspend(backends.get(str(result.status.backend)), result.suspend_workload, result.suspend)
    if result.queue_active is not None and result.queue_workload:
        cl.set_queue_active(result.queue_workload, result.queue_active)
    for ev in result.events:
        kopf.event(kbody, type=ev.type, reason=ev.reason, message=ev.message)
    if result.status.phase == api.RESTARTING and (result.status.restarts or 0) > restarts:
        metrics.RESTARTS.inc()
    ctx.phases.set(cl.namespace, cl.name, result.status.phase)
    if result.delete_self:
        logger.info("ttlSecondsAfterFinished expired: deleting the PetsTraining")
        cl.delete_training()
        return None
    if refused is not None and refused.requeue_after is not None:
        return max(0.5, refused.requeue_after)  # the refusal's own backoff
    return next_delay(result, ctx.settings.progress_interval, watched)


def status_write_wait(ctx: Context, key: Key, result: plan_types.Plan, new_status: dict[str, Any],
                      old_status: dict[str, Any]) -> float | None:
    """Seconds to hold back a Plan that only rewrites the status within the same phase (counts, a
    message, a waiting reason), when this training's status was written less than STATUS_WRITE_INTERVAL
    ago; None: act now. A training's pods starting or ending make a burst of such changes, each a write
    of the whole PetsTraining; at 1000 trainings they were most of the API server's work (docs/scale.md).
    A phase change and any Plan that creates, deletes or switches something is never held back."""
    if new_status == old_status or result.status.phase != old_status.get("phase") or \
            result.create or result.delete or result.force_delete or result.delete_self or \
            result.suspend is not None or result.queue_active is not None:
        return None
    since = time.monotonic() - ctx.status_written.get(key, float("-inf"))
    return STATUS_WRITE_INTERVAL - since if since < STATUS_WRITE_INTERVAL else None


def next_delay(result: plan_types.Plan, poll_active: float, watched: bool = True) -> float | None:
    """Seconds until the next round at the latest (None: only an event or the Plan's own deadline).

    Changes to a watched workload (a Job), its pods and Service wake the training at once, so it needs
    no poll but a slow resync; a workload that is not watched (a PyTorchJob) is polled while it runs.
    Sooner when the Plan asks (a TTL, a pending timeout, a stall bound, a refused child's backoff)."""
    phase = result.status.phase
    delay: float | None
    if phase in api.FINISHED_PHASES:
        delay = None
    elif phase == api.PENDING and result.status.pending_since:
        delay = poll_active  # its pods wait: mount failures are only in Events, which are not watched
    elif phase == api.RESTARTING or result.create or result.delete or result.force_delete:
        delay = 1.0  # a fallback: the deletions it waits for are watched
    elif phase == api.RUNNING:
        delay = RESYNC if watched else poll_active
    elif phase in (api.PENDING, api.SUSPENDED):
        delay = RESYNC if watched else POLL_IDLE
    else:
        delay = POLL_IDLE  # Queued (Kueue's Workload is not watched), Suspended, waiting for a CRD
    if result.requeue_after is not None:
        delay = result.requeue_after if delay is None else min(delay, result.requeue_after)
    return None if delay is None else max(0.5, delay)
