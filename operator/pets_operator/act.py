"""Carrying out a Plan: children first, then the status, deletions last. It decides nothing: a child the
API server refuses is reported back (and the round planned again with it), a Plan held back does
nothing, and the Plan says when the next round is due."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, cast

import kopf
from kubernetes.client.exceptions import ApiException

from pets_operator import backends, children, metrics, plan_types
from pets_operator.cluster import Cluster, api_message, child_refusal_permanent
from pets_operator.observe import kept

if TYPE_CHECKING:
    from pets_operator.context import Context

Logger = logging.Logger | logging.LoggerAdapter[Any]


def carry_out(ctx: Context, cl: Cluster, body: dict[str, Any], result: plan_types.Plan,
              logger: Logger) -> plan_types.Refused | None:
    """Act on a Plan; returns the child the API server refused to create, if it did (nothing after it is
    done: the round is planned again with the refusal), else None."""
    # Children first (creation is idempotent by name, so a crash before the status write is harmless);
    # then the status; deletions last: a restart's new attempt number must be stored before the old
    # workload goes, or a crash in between could restart the same attempt twice.
    if result.conflict is not None:
        raise kopf.TemporaryError(result.conflict, delay=result.next_round)
    if result.hold:
        return None  # the whole round again then (its Events too: they are made against the stored status)
    kbody = cast(kopf.Body, body)
    made: list[dict[str, Any]] = []
    for manifest in result.create:
        if children.owned(manifest):
            kopf.adopt(manifest, owner=kbody)
        try:
            created = cl.create(manifest)
        except ApiException as exc:  # refused: the training ends (Failed) or waits, saying why
            return _refused(manifest, made, exc, logger)
        if created is not None:
            child = (manifest["kind"], manifest["metadata"]["name"])
            ctx.created.setdefault(cl.key, {})[child] = kept(created)
            made.append(manifest)
            logger.info(f"created {manifest['kind']} {manifest['metadata']['name']}")
        else:
            logger.info(f"{manifest['kind']} {manifest['metadata']['name']} already exists; not recreated")
    old_status, new_status = body.get("status") or {}, result.status.to_dict()
    if new_status != old_status:
        ctx.written[cl.key] = kept(cl.patch_status(plan_types.merge_patch(old_status, new_status)))
        ctx.status_written[cl.key] = time.monotonic()
    _after_status(ctx, cl, kbody, result, logger)
    return None


def _refused(manifest: dict[str, Any], made: list[dict[str, Any]], exc: ApiException,
             logger: Logger) -> plan_types.Refused:
    """The API server refused to create `manifest` (`made`: created before it), in its words."""
    permanent = child_refusal_permanent(exc)
    child = f"{manifest['kind']} {manifest['metadata']['name']}"
    message = api_message(exc)
    metrics.ERRORS.labels(kind=f"api_{exc.status}").inc()
    logger.warning(f"the API server refused {child} (HTTP {exc.status}, "
                   f"{'permanent' if permanent else 'will retry'}): {message}")
    return plan_types.Refused(child, message, permanent, tuple(made))


def _after_status(ctx: Context, cl: Cluster, kbody: kopf.Body, result: plan_types.Plan,
                  logger: Logger) -> None:
    """What goes once the status is written: lost nodes' pods, deletions, switches, Events, the TTL."""
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
    if result.restarted:
        metrics.RESTARTS.inc()
    ctx.phases.set(cl.namespace, cl.name, result.status.phase)
    if result.delete_self:
        logger.info("ttlSecondsAfterFinished expired: deleting the PetsTraining")
        cl.delete_training()
