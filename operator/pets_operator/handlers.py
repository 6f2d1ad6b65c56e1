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
    output_durability,
    plan_types,
    pods,
    status,
    workqueue,
)
from pets_operator.cluster import (
    Cluster,
    api_message,
    child_refusal_permanent,
    has_default_storage_class,
    owned_by,
    served_backends,
)
from pets_operator.plan_types import Observed
from pets_operator.refusals import plan_backend_unavailable, plan_child_refused, plan_invalid
from pets_operator.scraper import Scraper, Target

# Seconds between reconciliations when nothing triggers one.
POLL_ACTIVE = api.DEFAULT_PROGRESS_INTERVAL  # progress reads; trainings whose state is not watched
POLL_IDLE = 30.0  # waiting for something that is not watched: a backend's CRD, Kueue's Workload
RESYNC = 600.0  # a training whose children are all watched: a safety net, read from the indices
WORKERS = api.DEFAULT_WORKERS  # concurrent reconciliations (each mostly waits on the API server)
SCRAPE_CONCURRENCY = api.DEFAULT_SCRAPE_CONCURRENCY
SCRAPE_TIMEOUT = api.DEFAULT_SCRAPE_TIMEOUT
STATUS_WRITE_INTERVAL = 10.0  # seconds between two status writes of a training within one phase
CHANGE_WINDOW = 1.0  # seconds a change waits for the ones that follow it (see Context.trigger)
CREATING_LONG = 5.0  # seconds a pod may take to start its containers before its Events are read
MAX_BACKOFF = 60.0  # seconds, after repeated transient API errors
LEGACY_FINALIZER = f"{api.GROUP}/operator"  # kopf's, from when each training had a daemon
JOB_WATCH_ID = "job-changed"
POD_WATCH_ID = "pod-changed"
SERVICE_WATCH_ID = "service-changed"
SPEC_WATCH_ID = "training-changed"
WATCH_IDS = (JOB_WATCH_ID, POD_WATCH_ID, SERVICE_WATCH_ID, SPEC_WATCH_ID)
OURS = {api.LABEL_MANAGED_BY: api.MANAGED_BY}
Key = tuple[str, str]  # (namespace, name) of a PetsTraining


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
    default_image: str = api.DEFAULT_IMAGE
    cluster_domain: str = api.DEFAULT_CLUSTER_DOMAIN
    progress_port: int = api.METRICS_PORT
    auto_backend: str = backends.DEFAULT_AUTO  # what spec.backend `auto` runs as (where it is served)
    default_output: dict[str, Any] = field(default_factory=api.default_output)  # where spec.output is unset
    network_policy: builders.NetworkPolicySettings = field(default_factory=builders.NetworkPolicySettings)
    poll_active: float = POLL_ACTIVE
    workers: int = WORKERS
    scrape_concurrency: int = SCRAPE_CONCURRENCY
    scrape_timeout: float = SCRAPE_TIMEOUT
    # Watching a fixed list of namespaces: the chart grants Roles only, so kopf must not scan
    # cluster-wide namespaces and CRDs (it would retry 403s for about a minute before starting).
    fixed_namespaces: bool = False
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
        body = _newest([*self._indexed(TRAININGS_INDEX, key), *([self.written[key]] if key in self.written
                                                                  else [])])
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
                if name in by_name and _rv(by_name[name]) >= _rv(obj):
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
            body = _newest(self._indexed(TRAININGS_INDEX, key))
            if body is None:
                continue
            backend = backends.BACKENDS.get(str((body.get("status") or {}).get("backend")), backends.JOB)
            pod = _newest_rank0(backend, self._indexed(PODS_INDEX, key))
            st = (pod or {}).get("status") or {}
            if pod is not None and st.get("phase") == "Running" and st.get("podIP"):
                yield Target(key, str(pod["metadata"].get("uid") or ""), str(st["podIP"]))


TRAININGS_INDEX, JOBS_INDEX, PODS_INDEX, SERVICES_INDEX = (
    "pets_trainings", "pets_training_jobs", "pets_training_pods", "pets_training_services")


def _rv(obj: dict[str, Any]) -> int:
    """resourceVersion as a number: etcd's revision, which grows with every write (0 if not a number)."""
    rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(rv) if rv.isdigit() else 0


def _newest(objs: list[dict[str, Any]]) -> dict[str, Any] | None:
    return max(objs, key=_rv, default=None)


def _kept(body: Mapping[str, Any]) -> dict[str, Any]:
    """What an index keeps of a watched object: what a round reads, not managedFields, and of a Job or
    PyTorchJob not its pod template, of a pod only its node, claims and container images (at 1000
    trainings the full objects held 340 MiB: docs/scale.md)."""
    meta = {k: v for k, v in body["metadata"].items() if k != "managedFields"}
    kept = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"), "metadata": meta,
            "status": body.get("status") or {}}
    spec = body.get("spec") or {}
    if body.get("kind") == "Pod":
        kept["spec"] = {"nodeName": spec.get("nodeName"),
                        "containers": [{"name": c.get("name"), "image": c.get("image")}
                                       for c in spec.get("containers") or []],
                        "volumes": [v for v in spec.get("volumes") or [] if "persistentVolumeClaim" in v]}
    elif body.get("kind") == "Job":
        kept["spec"] = {k: v for k, v in spec.items() if k != "template"}
    else:
        kept["spec"] = spec
    return kept


def _labels_match(labels: Mapping[str, str], selector: str) -> bool:
    """An equality-based label selector ("a=b,c=d", what backends.pods_selector gives) against labels."""
    wanted = (term.split("=", 1) for term in selector.split(",") if term)
    return all(labels.get(k.strip()) == v.strip() for k, v in wanted)


def _transient(exc: ApiException) -> bool:
    return exc.status in (409, 429) or exc.status is None or exc.status >= 500


Logger = logging.Logger | logging.LoggerAdapter[Any]


def _newest_rank0(backend: backends.Backend, pod_list: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Rank 0's pod (after a replacement the old one may linger: the newest wins)."""
    rank0 = [p for p in pod_list if backend.rank_of(p) == 0]
    return max(rank0, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""), default=None)


@dataclass(frozen=True)
class Rank0:
    """What rank 0's pod tells: live gauges, the final summary, and why the gauges could not be read."""

    progress: dict[str, float] | None = None
    summary: dict[str, Any] | None = None
    progress_error: str | None = None
    running_since: str | None = None  # when its trainer container started
    progress_failing_since: datetime | None = None  # since when its reads fail (scraper.Reading)


def _observe_rank0(pod: dict[str, Any] | None, phase_hint: str, scraper: Scraper | None, key: Key) -> Rank0:
    """Rank 0's live gauges (the scraper's last reading of this pod, while it runs) and its termination
    message (once finished)."""
    if pod is None:
        return Rank0()
    summary = running_since = None
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        state = cs.get("state") or {}
        if state.get("terminated"):
            summary = pods.parse_summary(state["terminated"].get("message"))
        running_since = (state.get("running") or {}).get("startedAt") or running_since
    st = pod.get("status") or {}
    if not st.get("podIP") or st.get("phase") != "Running" or phase_hint in api.FINISHED_PHASES:
        return Rank0(summary=summary)
    reading = scraper.reading(key, str(pod["metadata"].get("uid") or "")) if scraper is not None else None
    if reading is None:
        return Rank0(None, summary, None, running_since)
    return Rank0(reading.progress, summary, reading.error, running_since, reading.failing_since)


def _resolve_backend(ctx: Context, spec: dict[str, Any], old_status: dict[str, Any]
                     ) -> tuple[backends.Backend, str]:
    """The backend and why. `auto` is decided once, then kept in status.backend; discovery is asked
    only while undecided."""
    if spec["backend"] == "auto" and old_status.get("backend") in backends.BACKENDS:
        return backends.get(old_status["backend"]), str(old_status.get("backendReason") or "")
    # A built-in backend needs no discovery (one call per reconcile was a fifth of the idle requests
    # at scale: docs/scale.md).
    builtin = spec["backend"] != "auto" and backends.get(spec["backend"]).always_served
    served = set() if builtin else served_backends(ctx.api_client)
    backend = backends.resolve(spec, served, ctx.auto_backend)
    return backend, backends.why(spec, backend, ctx.auto_backend)


def _resolve_output(ctx: Context, old_status: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The output where spec.output is unset, and why (output_durability.OUTPUT_REASONS): the operator's
    default, chosen once and then kept in status.output, so a changed default never moves a training's work. A
    default claim with no StorageClass named falls back to an emptyDir where the cluster has no default
    StorageClass: the claim would wait for ever, and the training with it."""
    if isinstance(old_status.get("output"), dict):
        return old_status["output"], str(old_status.get("outputReason") or output_durability.OPERATOR_DEFAULT)
    chosen = ctx.default_output
    if "managedClaim" in chosen and not chosen["managedClaim"].get("storageClassName") \
            and has_default_storage_class(ctx.api_client) is False:
        return {"emptyDir": {}}, output_durability.NO_DEFAULT_STORAGE_CLASS
    return chosen, output_durability.OPERATOR_DEFAULT


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
        builders.dataset_source(spec)
    except backends.BackendUnavailable as exc:  # the CRD may be installed later: look again
        delay = _carry_out(ctx, cl, body, plan_backend_unavailable(body, str(exc), now), logger)
        return POLL_IDLE if delay is None else min(delay, POLL_IDLE)
    except api.SpecError as exc:  # Failed; a new spec (a training event) wakes it again
        metrics.ERRORS.labels(kind="permanent").inc()
        # None once written; the seconds until a write held back by STATUS_WRITE_INTERVAL may go
        return _carry_out(ctx, cl, body, plan_invalid(body, str(exc), now), logger)

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
        return [p for p in snap.pods if _labels_match(p["metadata"].get("labels") or {}, selector)]

    target = builders.Target(name, namespace, attempt, ctx.default_image, ctx.cluster_domain,
                             builders.queue_labels(body["metadata"].get("labels")),
                             network_policy=ctx.network_policy)
    state = None
    rank0 = Rank0()
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
        rank0 = _observe_rank0(_newest_rank0(backend, pod_list), state.phase, ctx.scraper, key)
        if state.phase not in api.FINISHED_PHASES:
            warnings = cl.pod_warnings([p["metadata"]["name"] for p in pod_list if _creating_long(p, now)])
            if _pods_missing_long(current, pod_list, spec["replicas"], backend, now):
                refusals = cl.workload_refusals(current["kind"], current["metadata"]["name"])
            if (claim_name := builders.output_claim(spec, name)) and any(not pods.scheduled_at(p)
                                                                         for p in pod_list):
                output_claim = cl.claim(claim_name)  # a pod waits to be scheduled: on its claim?

    candidates = _lost_candidates([*(pod_list or []), *(p for w in deleting for p in pods_of(w))])
    lost_pods, lost_nodes = _lost_pods(cl, candidates)
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
    delay = _carry_out(ctx, cl, body, result, logger, restarts=restarts, watched=watched)
    if delay is not None and len(candidates) > len(lost_pods):
        delay = min(delay, ctx.poll_active)  # a pod stuck terminating: is its node lost by now?
    return delay


def _pods_missing_long(workload: dict[str, Any], pod_list: list[dict[str, Any]], replicas: int,
                       backend: backends.Backend, now: datetime) -> bool:
    """Fewer pods than ranks, CREATING_LONG seconds after the (unsuspended) workload was made: only then
    are its Events read, for pods the API server refused to create."""
    if len(pod_list) >= replicas or backend.is_suspended(workload):
        return False
    made = workload["metadata"].get("creationTimestamp")
    return made is not None and (now - backends.parse_timestamp(made)).total_seconds() >= CREATING_LONG


def _creating_long(pod: dict[str, Any], now: datetime) -> bool:
    """Scheduled, containers not started, for CREATING_LONG seconds: only then are its Warning Events
    read (a mount that fails; a list of the namespace's Events, the costliest read of a round)."""
    since = pods.scheduled_at(pod)
    return pods.creating(pod) and since is not None and \
        (now - backends.parse_timestamp(since)).total_seconds() >= CREATING_LONG


def _lost_candidates(pod_list: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods that may sit on a lost node: being deleted and not finished (of the current workload, and
    of older ones being deleted). Only these make a round read their Node."""
    return [p for p in pod_list if pods.terminating_unfinished(p)]


def _lost_pods(cl: Cluster, candidates: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Of these pods (being deleted, not finished), those on a lost node, and why each such node is
    lost. Only pods being deleted are asked about, so a healthy round reads no Node."""
    lost, why = [], {}
    for pod in candidates:
        node = pods.node_of(pod)
        reason = cl.node_lost(node)
        if reason:
            lost.append(pod)
            why[node] = reason
    return lost, why


def _child_refused(cl: Cluster, body: dict[str, Any], result: plan_types.Plan, manifest: dict[str, Any],
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
    service = (result.status.get("children") or {}).get("service")
    if service and not any(m["kind"] == "Service" for m in made) and manifest["kind"] != "Service":
        cleanup.append({"apiVersion": "v1", "kind": "Service",
                        "metadata": {"name": service, "namespace": cl.namespace}})
    cleanup += [{"apiVersion": r["apiVersion"], "kind": r["kind"],
                 "metadata": {"name": r["name"], "namespace": r["namespace"]}} for r in result.delete]
    return plan_child_refused(body, message, datetime.now(UTC), permanent, child=child,
                                     cleanup=cleanup)


def _carry_out(ctx: Context, cl: Cluster, body: dict[str, Any], result: plan_types.Plan, logger: Logger,
               restarts: int = 0, watched: bool = True) -> float | None:
    """Act on a Plan; returns seconds until the next round (None: the training is gone)."""
    # Children first (creation is idempotent by name, so a crash before the status write is harmless);
    # then the status; deletions last: a restart's new attempt number must be stored before the old
    # workload goes, or a crash in between could restart the same attempt twice.
    kbody = cast(kopf.Body, body)
    old_status = body.get("status") or {}
    wait = _status_write_wait(ctx, cl.key, result, old_status)
    if wait is not None:
        return wait  # the whole round again then (its Events too: they are made against the stored status)
    refused: plan_types.Plan | None = None
    made: list[dict[str, Any]] = []
    for manifest in result.create:
        if builders.owned(manifest):
            kopf.adopt(manifest, owner=kbody)
        try:
            created = cl.create(manifest)
        except ApiException as exc:  # refused: the training ends (Failed) or waits, saying why
            refused = _child_refused(cl, body, result, manifest, made, exc, logger)
            break
        if created is not None:
            child = (manifest["kind"], manifest["metadata"]["name"])
            ctx.created.setdefault(cl.key, {})[child] = _kept(created)
            made.append(manifest)
            logger.info(f"created {manifest['kind']} {manifest['metadata']['name']}")
        else:
            logger.info(f"{manifest['kind']} {manifest['metadata']['name']} already exists; not recreated")
    if refused is not None:
        result = refused
    new_status = result.status
    if new_status != old_status:
        ctx.written[cl.key] = _kept(cl.patch_status(plan_types.merge_patch(old_status, new_status)))
        ctx.status_written[cl.key] = time.monotonic()
    # Pods on lost nodes go after the status write too: the attempt they fail is recorded (restarted)
    # first, so a crash in between never leaves a running workload short of a pod it would replace.
    for pod in result.force_delete:
        logger.warning(f"force-deleting pod {pod['name']}: its node is lost")
        cl.force_delete_pod(pod["name"], pod.get("uid") or None)
    for ref in result.delete:
        logger.info(f"deleting {ref['kind']} {ref['name']} (previous attempt)")
        cl.delete(ref)
    if result.suspend is not None and result.suspend_workload:
        cl.set_suspend(backends.get(new_status["backend"]), result.suspend_workload, result.suspend)
    if result.queue_active is not None and result.queue_workload:
        cl.set_queue_active(result.queue_workload, result.queue_active)
    for ev in result.events:
        kopf.event(kbody, type=ev.type, reason=ev.reason, message=ev.message)
    if new_status.get("phase") == api.RESTARTING and new_status.get("restarts", 0) > restarts:
        metrics.RESTARTS.inc()
    ctx.phases.set(cl.namespace, cl.name, new_status.get("phase"))
    if result.delete_self:
        logger.info("ttlSecondsAfterFinished expired: deleting the PetsTraining")
        cl.delete_training()
        return None
    if refused is not None and refused.requeue_after is not None:
        return max(0.5, refused.requeue_after)  # the refusal's own backoff
    return next_delay(result, ctx.poll_active, watched)


def _status_write_wait(ctx: Context, key: Key, result: plan_types.Plan, old_status: dict[str, Any]
                       ) -> float | None:
    """Seconds to hold back a Plan that only rewrites the status within the same phase (counts, a
    message, a waiting reason), when this training's status was written less than STATUS_WRITE_INTERVAL
    ago; None: act now. A training's pods starting or ending make a burst of such changes, each a write
    of the whole PetsTraining; at 1000 trainings they were most of the API server's work (docs/scale.md).
    A phase change and any Plan that creates, deletes or switches something is never held back."""
    if result.status == old_status or result.status.get("phase") != old_status.get("phase") or \
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
    phase = result.status.get("phase")
    delay: float | None
    if phase in api.FINISHED_PHASES:
        delay = None
    elif phase == api.PENDING and result.status.get("pendingSince"):
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


def register(registry: kopf.OperatorRegistry, ctx: Context) -> None:
    """Register every handler of the operator into `registry`, bound to `ctx`."""

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Reconciliations run blocking client calls in threads: one per worker.
        asyncio.get_running_loop().set_default_executor(
            concurrent.futures.ThreadPoolExecutor(max_workers=ctx.workers, thread_name_prefix="reconcile"))
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
        settings.posting.level = logging.WARNING  # our own Events go through kopf.event()
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 60
        settings.scanning.disabled = ctx.fixed_namespaces
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
        return {(namespace, name): _kept(body)} if namespace else None

    def child_key(namespace: str | None, labels: Mapping[str, str]) -> Key | None:
        owner = labels.get(api.LABEL_TRAINING)
        return (namespace, owner) if namespace and owner else None

    def index_children(index_id: str, *coordinates: str) -> None:
        @kopf.index(*coordinates, registry=registry, labels=OURS, id=index_id)
        async def children(namespace: str | None, labels: Mapping[str, str], body: kopf.Body,
                           **_: Any) -> dict[Key, dict[str, Any]] | None:
            key = child_key(namespace, labels)
            return {key: _kept(body)} if key else None

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
    ctx.scraper = Scraper(ctx.progress_port, ctx.poll_active, ctx.scrape_concurrency, ctx.scrape_timeout,
                          ctx.scrape_targets, ctx.trigger)
    ctx.tasks += [asyncio.create_task(_worker(ctx), name=f"reconcile-worker-{i}") for i in range(ctx.workers)]
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
