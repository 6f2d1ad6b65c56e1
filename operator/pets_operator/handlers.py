"""The kopf registrations: the indices, the watches that wake a training, and the workers.

Reconciliation is driven by watches, not by re-reading. kopf keeps four in-memory indices from its
watches (PetsTrainings, and the Jobs, pods and Services labelled as ours, filtered by the API server),
and every change to one of them puts the training's key on a work queue (`workqueue.WorkQueue`:
coalesced, one worker per key at a time, new trainings first). A worker takes a snapshot of the
training and its children from the indices (`context.Context.snapshot`) and runs
`reconcile.reconcile_once` in a thread: it reads nothing
back from the API server for Jobs, pods and Services, and writes only what the Plan changes. The Plan's
deadlines (a TTL, a pending timeout, a stall bound) come back through the queue's timer. Rank 0's
progress is read by `scraper.Scraper`, off this path; a reading that changes wakes the training.
kopf waits for every index to be filled from its initial listing before it calls any other handler,
so no worker ever plans from a half-filled cache.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Mapping
from typing import Any, cast

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from pets_operator import api, backends, ended_runs, metrics, observe, standby, workqueue
from pets_operator.cluster import api_message
from pets_operator.context import JOBS_INDEX, PODS_INDEX, SERVICES_INDEX, TRAININGS_INDEX, Context
from pets_operator.observe import Key
from pets_operator.pacing import POLL_IDLE
from pets_operator.reconcile import reconcile_once
from pets_operator.scraper import Scraper

MAX_BACKOFF = 60.0  # seconds, after repeated transient API errors
JOB_WATCH_ID = "job-changed"
POD_WATCH_ID = "pod-changed"
SERVICE_WATCH_ID = "service-changed"
SPEC_WATCH_ID = "training-changed"
WATCH_IDS = (JOB_WATCH_ID, POD_WATCH_ID, SERVICE_WATCH_ID, SPEC_WATCH_ID)
OURS = {api.LABEL_MANAGED_BY: api.MANAGED_BY}



def register(registry: kopf.OperatorRegistry, ctx: Context) -> None:
    """Register every handler of the operator into `registry`, bound to `ctx`."""
    _register_lifecycle(registry, ctx)
    _register_trainings(registry, ctx)
    _register_children(registry, ctx, JOBS_INDEX, JOB_WATCH_ID, backends.JOB.group, backends.JOB.version,
                       backends.JOB.plural)
    _register_children(registry, ctx, PODS_INDEX, POD_WATCH_ID, "v1", "pods")
    _register_children(registry, ctx, SERVICES_INDEX, SERVICE_WATCH_ID, "v1", "services")


def _register_lifecycle(registry: kopf.OperatorRegistry, ctx: Context) -> None:
    """kopf's settings at start-up, the workers stopped at clean-up, and the login."""

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Reconciliations run blocking client calls in threads: one per worker.
        asyncio.get_running_loop().set_default_executor(
            concurrent.futures.ThreadPoolExecutor(max_workers=ctx.settings.workers,
                                                  thread_name_prefix="reconcile"))
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
        settings.posting.level = logging.WARNING  # our own Events go through kopf.event()
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 60
        # A fixed list of namespaces: the chart grants Roles only, so kopf must not scan cluster-wide
        # namespaces and CRDs (it would retry 403s for about a minute before starting).
        settings.scanning.disabled = bool(ctx.settings.namespaces)
        # Only our children travel: the API server filters them (kopf's own label filters are client-side).
        selector = f"{api.LABEL_MANAGED_BY}={api.MANAGED_BY}"
        for resource in (("batch", "jobs"), ("v1", "pods"), ("v1", "services")):
            settings.watching.label_selectors[resource] = selector

    @kopf.on.cleanup(registry=registry)
    async def stop(**_: Any) -> None:
        for task in ctx.tasks:
            task.cancel()
        await asyncio.gather(*ctx.tasks, return_exceptions=True)
        ctx.tasks.clear()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(ctx.api_client.configuration)


def _register_trainings(registry: kopf.OperatorRegistry, ctx: Context) -> None:
    """The index of trainings, and the watch that puts a training on the work queue when it changes."""

    # The indices: kopf fills them from its initial listing before calling any other handler.
    @kopf.index(api.GROUP, api.VERSION, api.PLURAL, registry=registry, id=TRAININGS_INDEX)
    async def trainings(namespace: str | None, name: str, body: kopf.Body, **_: Any
                        ) -> dict[Key, dict[str, Any]] | None:
        return {(namespace, name): observe.kept(body)} if namespace else None

    @kopf.on.event(api.GROUP, api.VERSION, api.PLURAL, registry=registry, id=SPEC_WATCH_ID)
    async def training_changed(event: Mapping[str, Any], namespace: str | None, name: str,
                               meta: Mapping[str, Any], status: Mapping[str, Any], **kwargs: Any) -> None:
        if not namespace:
            return
        _start(ctx, kwargs)
        key = (namespace, name)
        if event.get("type") == "DELETED":
            ctx.forget(key)
            return
        # Our own status writes change nothing here: only what the user (or an API) changes wakes it.
        wakes = (meta.get("generation"), meta.get("deletionTimestamp"), tuple(meta.get("finalizers") or ()),
                 tuple(sorted((meta.get("labels") or {}).items())), status.get("observedGeneration") is None)
        if ctx.seen.get(key) != wakes:
            ctx.seen[key] = wakes
            ctx.trigger(key, workqueue.URGENT if not status.get("phase") else workqueue.CHANGED)


def _register_children(registry: kopf.OperatorRegistry, ctx: Context, index_id: str, watch_id: str,
                       *coordinates: str) -> None:
    """The index of our children of one kind, and the watch that wakes their training."""

    @kopf.index(*coordinates, registry=registry, labels=OURS, id=index_id)
    async def children(namespace: str | None, labels: Mapping[str, str], body: kopf.Body,
                       **_: Any) -> dict[Key, dict[str, Any]] | None:
        key = _child_key(namespace, labels)
        return {key: observe.kept(body)} if key else None

    @kopf.on.event(*coordinates, registry=registry, labels=OURS, id=watch_id)
    async def child_changed(event: Mapping[str, Any], namespace: str | None, labels: Mapping[str, str],
                            body: kopf.Body, **kwargs: Any) -> None:
        if key := _child_key(namespace, labels):
            _start(ctx, kwargs)
            if event.get("type") == "DELETED":  # what we created and the index never showed: gone
                ctx.created.get(key, {}).pop((str(body.get("kind")), body["metadata"]["name"]), None)
            if event.get("type") == "DELETED" or body["metadata"].get("deletionTimestamp"):
                # rank 0's summary, for the rounds after the index dropped its pod
                ctx.keep_ended(key, ended_runs.of_pod(dict(body)))
            ctx.trigger(key)


def _child_key(namespace: str | None, labels: Mapping[str, str]) -> Key | None:
    owner = labels.get(api.LABEL_TRAINING)
    return (namespace, owner) if namespace and owner else None


def _start(ctx: Context, handler_kwargs: Mapping[str, Any]) -> None:
    """Start the queue's workers, its timer and the scraper, once, from kopf's first event handler call:
    its context carries kopf's Event poster (kopf.event from a worker thread needs it), and by then
    every index is filled."""
    if ctx.queue is not None:
        return
    ctx.indices = {i: handler_kwargs[i] for i in (TRAININGS_INDEX, JOBS_INDEX, PODS_INDEX, SERVICES_INDEX)}
    ctx.queue = workqueue.WorkQueue()
    settings = ctx.settings
    ctx.scraper = Scraper(settings.progress_port, settings.progress_interval, settings.scrape_concurrency,
                          settings.scrape_timeout, ctx.scrape_targets, ctx.trigger)
    ctx.tasks += [asyncio.create_task(_worker(ctx), name=f"reconcile-worker-{i}")
                  for i in range(settings.workers)]
    ctx.tasks.append(asyncio.create_task(ctx.queue.run_timers(), name="reconcile-timers"))
    ctx.tasks.append(asyncio.create_task(ctx.scraper.run(), name="progress-scraper"))


async def _worker(ctx: Context) -> None:
    assert ctx.queue is not None
    while True:
        key = cast(Key, await ctx.queue.get())
        metrics.QUEUE_DEPTH.set(len(ctx.queue))
        try:
            if not await _acting(ctx):
                # Another replica acts (kopf paused our watches): not from our frozen indices. Ask again.
                ctx.stood_by()
                ctx.queue.add_after(key, standby.RECHECK_SECONDS)
                continue
            if ctx.needs_reread(key):
                ctx.reread_as(key, await asyncio.to_thread(ctx.read_training, key))
            await _reconcile_key(ctx, key)
        except Exception:  # noqa: BLE001 - one training's bug must not stop the worker
            logging.getLogger(__name__).exception(f"[{key[0]}/{key[1]}] reconciliation failed")
            metrics.RECONCILES.labels(result="error").inc()
            ctx.queue.add_after(key, _backoff(ctx, key))
        finally:
            ctx.queue.done(key)


async def _acting(ctx: Context) -> bool:
    """Whether this replica may act (standby.py): the peering objects are read in a thread when the
    answer is due again, not on every round."""
    guard = ctx.standby
    if guard is None:
        return True
    return await asyncio.to_thread(guard.acting) if guard.due() else guard.acting()


def _backoff(ctx: Context, key: Key) -> float:
    ctx.failures[key] = ctx.failures.get(key, 0) + 1
    return float(min(MAX_BACKOFF, 2 ** ctx.failures[key]))


async def _reconcile_key(ctx: Context, key: Key) -> None:
    assert ctx.queue is not None
    snap = ctx.snapshot(key)
    if snap is None:
        ctx.forget(key)
        return
    logger = _Prefixed(logging.getLogger("pets_operator.training"), {"prefix": f"[{key[0]}/{key[1]}] "})
    kbody = cast(kopf.Body, snap.body)
    started = time.perf_counter()
    try:
        delay = await asyncio.to_thread(reconcile_once, ctx, snap, logger)
    except ApiException as exc:
        metrics.ERRORS.labels(kind=f"api_{exc.status}").inc()
        metrics.RECONCILES.labels(result="error").inc()
        detail = f"API error {exc.status} {exc.reason}: {api_message(exc)}"
        logger.warning(detail)
        if exc.status in (400, 422):  # a request the server refuses: retrying cannot help
            kopf.warn(kbody, reason="Rejected", message=detail)
            return  # until the training changes
        if exc.status == 403:  # RBAC, or a namespace being deleted: may change, retry slowly
            kopf.warn(kbody, reason="Forbidden", message=f"{detail}; check the operator's RBAC")
            ctx.queue.add_after(key, POLL_IDLE)
            return
        transient = exc.status in (409, 429) or exc.status is None or exc.status >= 500
        ctx.queue.add_after(key, _backoff(ctx, key) if transient else POLL_IDLE)
        return
    except kopf.TemporaryError as exc:
        metrics.ERRORS.labels(kind="temporary").inc()
        metrics.RECONCILES.labels(result="error").inc()
        logger.warning(str(exc))
        ctx.queue.add_after(key, exc.delay or POLL_IDLE)
        return
    ctx.failures.pop(key, None)
    metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)
    metrics.RECONCILES.labels(result="ok").inc()
    if delay is not None:
        ctx.queue.add_after(key, delay)


class _Prefixed(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Log lines of one training, prefixed with its namespace/name."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return f"{(self.extra or {}).get('prefix', '')}{msg}", kwargs


def connection_info(cfg: client.Configuration) -> kopf.ConnectionInfo:
    """kopf's credentials from the same kubernetes-client Configuration our own calls use."""
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
    scheme = token = None
    if header:
        parts = header.split(" ", 1)
        scheme, token = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        scheme=scheme,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )
