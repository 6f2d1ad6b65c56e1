"""Thin kopf adapters: observe the cluster, ask `status.plan()`, carry the Plan out.

Reconciliation is driven by watches, not by re-reading. kopf keeps four in-memory indices from its
watches (PetsTrainings, and the Jobs, pods and Services labelled as ours, filtered by the API server),
and every change to one of them puts the training's key on a work queue (`workqueue.WorkQueue`:
coalesced, one worker per key at a time, new trainings first). A worker takes a snapshot of the
training and its children from the indices and runs `reconcile_once` in a thread: it reads nothing
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
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from pets_operator import (
    api,
    backends,
    builders,
    metrics,
    observe,
    output_durability,
    pods,
    status,
    workqueue,
)
from pets_operator.act import POLL_IDLE, Logger, carry_out
from pets_operator.cluster import (
    Cluster,
    api_message,
    has_default_storage_class,
    owned_by,
    served_backends,
)
from pets_operator.observe import Key
from pets_operator.plan_types import Observed
from pets_operator.refusals import plan_backend_unavailable, plan_invalid
from pets_operator.scraper import Scraper, Target
from pets_operator.settings import Settings

CHANGE_WINDOW = 1.0  # seconds a change waits for the ones that follow it (see Context.trigger)
MAX_BACKOFF = 60.0  # seconds, after repeated transient API errors
LEGACY_FINALIZER = f"{api.GROUP}/operator"  # kopf's, from when each training had a daemon
JOB_WATCH_ID = "job-changed"
POD_WATCH_ID = "pod-changed"
SERVICE_WATCH_ID = "service-changed"
SPEC_WATCH_ID = "training-changed"
WATCH_IDS = (JOB_WATCH_ID, POD_WATCH_ID, SERVICE_WATCH_ID, SPEC_WATCH_ID)
OURS = {api.LABEL_MANAGED_BY: api.MANAGED_BY}


@dataclass(frozen=True)
class Snapshot:
    """One PetsTraining and its watched children, as the indices (and our own latest writes) hold them."""

    body: dict[str, Any]
    jobs: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    services: list[dict[str, Any]]


@dataclass
class Context:
    """What every handler of one operator instance shares."""

    api_client: client.ApiClient
    settings: Settings = field(default_factory=Settings)
    phases: metrics.PhaseBook = field(default_factory=metrics.PhaseBook)
    queue: workqueue.WorkQueue | None = None  # made in the operator's event loop, with the tasks
    indices: Mapping[str, Any] = field(default_factory=dict)  # kopf's, by index id
    scraper: Scraper | None = None
    # What this operator wrote and the indices may not show yet (the watch event is on its way): the
    # training's body after our status patch, and children we created, newest resourceVersion wins.
    written: dict[Key, dict[str, Any]] = field(default_factory=dict)
    created: dict[Key, dict[tuple[str, str], dict[str, Any]]] = field(default_factory=dict)
    seen: dict[Key, tuple[Any, ...]] = field(default_factory=dict)  # what of a training wakes it
    failures: dict[Key, int] = field(default_factory=dict)  # consecutive transient errors, for backoff
    status_written: dict[Key, float] = field(default_factory=dict)  # monotonic time of the last status write
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def trigger(self, key: Hashable, priority: int = workqueue.CHANGED) -> None:
        """Wake a training: a new one at once; a change after CHANGE_WINDOW, so the burst of pod
        updates a start or an end makes (scheduled, started, ready, for every rank) is one round and
        one status write, not one each."""
        if self.queue is None:
            return
        if priority == workqueue.URGENT:
            self.queue.add(key, priority)
        else:
            self.queue.add_after(key, CHANGE_WINDOW, priority)

    def forget(self, key: Key) -> None:
        """The training is gone: drop what is kept for it."""
        for kept in (self.written, self.created, self.seen, self.failures, self.status_written):
            kept.pop(key, None)
        if self.queue is not None:
            self.queue.forget(key)
        if self.scraper is not None:
            self.scraper.forget(key)
        self.phases.set(key[0], key[1], None)

    def snapshot(self, key: Key) -> Snapshot | None:
        """The training and its children from the indices, merged with our own newer writes. Runs in the
        event loop, where kopf updates the indices, so it never sees one half-updated."""
        written = [self.written[key]] if key in self.written else []
        body = observe.newest([*self._indexed(TRAININGS_INDEX, key), *written])
        if body is None:
            return None
        if self.written.get(key) is not None and body is not self.written[key]:
            del self.written[key]  # the watch caught up
        children: dict[str, list[dict[str, Any]]] = {}
        created = self.created.get(key, {})
        for kind, index in (("Job", JOBS_INDEX), ("Pod", PODS_INDEX), ("Service", SERVICES_INDEX)):
            by_name = {o["metadata"]["name"]: o for o in self._indexed(index, key)}
            for (ckind, name), obj in list(created.items()):
                if ckind != kind:
                    continue
                if name in by_name and observe.rv(by_name[name]) >= observe.rv(obj):
                    del created[(ckind, name)]  # the watch caught up
                else:
                    by_name[name] = obj
            children[kind] = list(by_name.values())
        return Snapshot(body, children["Job"], children["Pod"], children["Service"])

    def _indexed(self, index_id: str, key: Key) -> list[dict[str, Any]]:
        index = self.indices.get(index_id)
        store = index.get(key) if index is not None else None
        return list(store) if store is not None else []

    def scrape_targets(self) -> Iterable[Target]:
        """Rank 0 of every Running training, from the indices."""
        for (namespace, name), phase in self.phases.items():
            if phase != api.RUNNING:
                continue
            key = (namespace, name)
            body = observe.newest(self._indexed(TRAININGS_INDEX, key))
            if body is None:
                continue
            backend = backends.BACKENDS.get(str((body.get("status") or {}).get("backend")), backends.JOB)
            pod = observe.newest_rank0(backend, self._indexed(PODS_INDEX, key))
            st = (pod or {}).get("status") or {}
            if pod is not None and st.get("phase") == "Running" and st.get("podIP"):
                yield Target(key, str(pod["metadata"].get("uid") or ""), str(st["podIP"]))


TRAININGS_INDEX, JOBS_INDEX, PODS_INDEX, SERVICES_INDEX = (
    "pets_trainings", "pets_training_jobs", "pets_training_pods", "pets_training_services")


def _transient(exc: ApiException) -> bool:
    return exc.status in (409, 429) or exc.status is None or exc.status >= 500


def _resolve_backend(ctx: Context, spec: dict[str, Any], old_status: dict[str, Any]
                     ) -> tuple[backends.Backend, str]:
    return backends.keep_or_choose(spec, old_status, lambda: served_backends(ctx.api_client),
                                   ctx.settings.auto_backend)


def _resolve_output(ctx: Context, old_status: dict[str, Any]) -> tuple[dict[str, Any], str]:
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
    old_status = body.get("status") or {}
    try:
        spec = api.resolve_spec(body.get("spec"))
        backend, backend_reason = _resolve_backend(ctx, spec, old_status)
        output_reason = ""
        if "output" not in spec:
            spec["output"], output_reason = _resolve_output(ctx, old_status)
    except backends.BackendUnavailable as exc:  # the CRD may be installed later: look again
        delay = carry_out(ctx, cl, body, plan_backend_unavailable(body, str(exc), now), logger)
        return POLL_IDLE if delay is None else min(delay, POLL_IDLE)
    except api.SpecError as exc:  # Failed; a new spec (a training event) wakes it again
        metrics.ERRORS.labels(kind="permanent").inc()
        # None once written; the seconds until a write held back by STATUS_WRITE_INTERVAL may go
        return carry_out(ctx, cl, body, plan_invalid(body, str(exc), now), logger)

    restarts = int(old_status.get("restarts") or 0)
    attempt = int(old_status.get("attempt", restarts))  # before `attempt` existed, one per restart
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
    # Workloads already being deleted need no second delete, but still block the next attempt.
    deleting = {w["metadata"]["name"] for w in stale if w["metadata"].get("deletionTimestamp")}

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
                             network_policy=settings.network_policy)
    state = None
    rank0 = observe.Rank0()
    pod_list: list[dict[str, Any]] | None = None
    warnings: dict[str, list[dict[str, Any]]] = {}
    refusals: list[dict[str, Any]] = []
    queue_served, queue_workload = True, None
    output_claim: dict[str, Any] | None = None
    if current is None and "managedClaim" in spec["output"] and not stale:
        output_claim = cl.claim(builders.output_claim_name(name))  # about to be made: not an old one's?
    if current is not None:
        if target.queued:
            queue_served, queue_workload = cl.queue_workload(current)
        state = backend.state(current, spec["replicas"])
        pod_list = pods_of(current["metadata"]["name"])
        rank0 = observe.observe_rank0(observe.newest_rank0(backend, pod_list), state.phase, ctx.scraper, key)
        if state.phase not in api.FINISHED_PHASES:
            warnings = cl.pod_warnings([p["metadata"]["name"] for p in pod_list
                                        if observe.creating_long(p, now)])
            if observe.pods_missing_long(current, pod_list, spec["replicas"], backend, now):
                refusals = cl.workload_refusals(current["kind"], current["metadata"]["name"])
            if (claim_name := builders.output_claim(spec, name)) and any(not pods.scheduled_at(p)
                                                                         for p in pod_list):
                output_claim = cl.claim(claim_name)  # a pod waits to be scheduled: on its claim?

    candidates = observe.lost_candidates([*(pod_list or []), *(p for w in deleting for p in pods_of(w))])
    lost_pods, lost_nodes = observe.lost_pods(cl, candidates)
    observed = Observed(backend=backend, backend_reason=backend_reason, workload=current, stale=stale,
                        service=service, progress=rank0.progress, summary=rank0.summary, state=state,
                        pods=pod_list, pod_events=warnings, workload_refusals=refusals,
                        progress_error=rank0.progress_error,
                        progress_failing_since=rank0.progress_failing_since,
                        rank0_running_since=rank0.running_since, queue_workload=queue_workload,
                        queue_served=queue_served, lost_pods=lost_pods, lost_nodes=lost_nodes,
                        output_reason=output_reason, output_claim=output_claim)
    result = status.plan(body, spec, observed, target, now)
    result.delete = [r for r in result.delete if r["name"] not in deleting]
    delay = carry_out(ctx, cl, body, result, logger, restarts=restarts, watched=watched)
    if delay is not None and len(candidates) > len(lost_pods):
        # a pod stuck terminating: is its node lost by now?
        delay = min(delay, ctx.settings.progress_interval)
    return delay


def register(registry: kopf.OperatorRegistry, ctx: Context) -> None:
    """Register every handler of the operator into `registry`, bound to `ctx`."""

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
        settings.scanning.disabled = ctx.settings.fixed_namespaces
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

    # The indices: kopf fills them from its initial listing before calling any other handler.
    @kopf.index(api.GROUP, api.VERSION, api.PLURAL, registry=registry, id=TRAININGS_INDEX)
    async def trainings(namespace: str | None, name: str, body: kopf.Body, **_: Any
                        ) -> dict[Key, dict[str, Any]] | None:
        return {(namespace, name): observe.kept(body)} if namespace else None

    def child_key(namespace: str | None, labels: Mapping[str, str]) -> Key | None:
        owner = labels.get(api.LABEL_TRAINING)
        return (namespace, owner) if namespace and owner else None

    def index_children(index_id: str, *coordinates: str) -> None:
        @kopf.index(*coordinates, registry=registry, labels=OURS, id=index_id)
        async def children(namespace: str | None, labels: Mapping[str, str], body: kopf.Body,
                           **_: Any) -> dict[Key, dict[str, Any]] | None:
            key = child_key(namespace, labels)
            return {key: observe.kept(body)} if key else None

    index_children(JOBS_INDEX, backends.JOB.group, backends.JOB.version, backends.JOB.plural)
    index_children(PODS_INDEX, "v1", "pods")
    index_children(SERVICES_INDEX, "v1", "services")

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

    def watch_children(watch_id: str, *coordinates: str) -> None:
        @kopf.on.event(*coordinates, registry=registry, labels=OURS, id=watch_id)
        async def child_changed(event: Mapping[str, Any], namespace: str | None, labels: Mapping[str, str],
                                body: kopf.Body, **kwargs: Any) -> None:
            key = child_key(namespace, labels)
            if key:
                _start(ctx, kwargs)
                if event.get("type") == "DELETED":  # what we created and the index never showed: gone
                    ctx.created.get(key, {}).pop((str(body.get("kind")), body["metadata"]["name"]), None)
                ctx.trigger(key)

    watch_children(JOB_WATCH_ID, backends.JOB.group, backends.JOB.version, backends.JOB.plural)
    watch_children(POD_WATCH_ID, "v1", "pods")
    watch_children(SERVICE_WATCH_ID, "v1", "services")


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
            await _reconcile_key(ctx, key)
        except Exception:  # noqa: BLE001 - one training's bug must not stop the worker
            logging.getLogger(__name__).exception(f"[{key[0]}/{key[1]}] reconciliation failed")
            metrics.RECONCILES.labels(result="error").inc()
            ctx.queue.add_after(key, _backoff(ctx, key))
        finally:
            ctx.queue.done(key)


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
        ctx.queue.add_after(key, _backoff(ctx, key) if _transient(exc) else POLL_IDLE)
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
