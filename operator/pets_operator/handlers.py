"""Thin kopf adapters: observe the cluster, ask `status.plan()`, carry the Plan out.

One daemon per PetsTraining runs `reconcile_once` in a loop: on start (create or operator restart),
whenever its Job changes or its spec is edited (a trigger), and periodically to mirror rank 0's
progress. A single task per object means no two reconciliations of one training ever race.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from pets_operator import api, backends, builders, metrics, pods, progress, status
from pets_operator.cluster import Cluster, api_message, child_refusal_permanent, owned_by, served_backends

# Seconds between reconciliations when nothing triggers one.
POLL_ACTIVE = 10.0
POLL_IDLE = 30.0
POLL_FINISHED = 600.0
JOB_WATCH_ID = "job-changed"
SPEC_WATCH_ID = "spec-changed"
WORKER_THREADS = 16  # concurrent reconciliations (each mostly waits on the API server)


@dataclass
class Context:
    """What every handler of one operator instance shares."""

    api_client: client.ApiClient
    default_image: str = api.DEFAULT_IMAGE
    cluster_domain: str = api.DEFAULT_CLUSTER_DOMAIN
    progress_port: int = api.METRICS_PORT
    auto_backend: str = backends.DEFAULT_AUTO  # what spec.backend `auto` runs as (where it is served)
    poll_active: float = POLL_ACTIVE
    # Watching a fixed list of namespaces: the chart grants Roles only, so kopf must not scan
    # cluster-wide namespaces and CRDs (it would retry 403s for about a minute before starting).
    fixed_namespaces: bool = False
    triggers: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    phases: metrics.PhaseBook = field(default_factory=metrics.PhaseBook)

    def trigger(self, namespace: str, name: str) -> None:
        event = self.triggers.get((namespace, name))
        if event is not None:
            event.set()


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


def _observe_rank0(pod: dict[str, Any] | None, phase_hint: str, progress_port: int) -> Rank0:
    """Rank 0's live gauges (while running) and its termination message (once finished)."""
    if pod is None:
        return Rank0()
    summary = running_since = None
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        state = cs.get("state") or {}
        if state.get("terminated"):
            summary = pods.parse_summary(state["terminated"].get("message"))
        running_since = (state.get("running") or {}).get("startedAt") or running_since
    ip = (pod.get("status") or {}).get("podIP")
    if not ip or (pod.get("status") or {}).get("phase") != "Running" or phase_hint in api.FINISHED_PHASES:
        return Rank0(summary=summary)
    url = f"http://{ip}:{progress_port}/metrics"
    try:
        return Rank0(progress.scrape(ip, progress_port) or None, summary, None, running_since)
    except (OSError, ValueError) as exc:
        return Rank0(None, summary, f"{url}: {exc}", running_since)


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


def reconcile_once(ctx: Context, namespace: str, name: str, logger: Logger) -> float | None:
    """One observe -> plan -> act round. Returns seconds until the next round (None: object gone)."""
    cl = Cluster(ctx.api_client, namespace, name)
    body = cl.get_training()
    if body is None or body["metadata"].get("deletionTimestamp"):
        ctx.phases.set(namespace, name, None)
        return None
    now = datetime.now(UTC)
    old_status = body.get("status") or {}
    try:
        spec = api.resolve_spec(body.get("spec"))
        backend, backend_reason = _resolve_backend(ctx, spec, old_status)
        builders.dataset_source(spec)
    except backends.BackendUnavailable as exc:  # the CRD may be installed later: wait for it
        _carry_out(ctx, cl, body, status.plan_backend_unavailable(body, str(exc), now), logger)
        return POLL_IDLE
    except api.SpecError as exc:
        _carry_out(ctx, cl, body, status.plan_invalid(body, str(exc), now), logger)
        raise kopf.PermanentError(str(exc)) from exc

    restarts = int(old_status.get("restarts") or 0)
    attempt = int(old_status.get("attempt", restarts))  # before `attempt` existed, one per restart
    current_name = builders.job_name(name, attempt)
    uid = body["metadata"]["uid"]
    current, stale = None, []
    for w in cl.workloads(backend):
        if not owned_by(w, uid):
            continue  # same label, another owner: not ours to touch
        if w["metadata"]["name"] == current_name and not w["metadata"].get("deletionTimestamp"):
            current = w
        else:
            stale.append(w)
    # Workloads already being deleted need no second delete, but still block the next attempt.
    deleting = {w["metadata"]["name"] for w in stale if w["metadata"].get("deletionTimestamp")}

    service = cl.service() if backend.uses_service else None
    if service is not None and not owned_by(service, uid):
        raise kopf.TemporaryError(
            f"Service {namespace}/{service['metadata']['name']} exists and is not owned by this "
            "PetsTraining; delete or rename it", delay=POLL_IDLE)

    target = builders.Target(name, namespace, attempt, ctx.default_image, ctx.cluster_domain,
                             builders.queue_labels(body["metadata"].get("labels")))
    state = None
    rank0 = Rank0()
    pod_list: list[dict[str, Any]] | None = None
    warnings: dict[str, list[dict[str, Any]]] = {}
    queue_served, queue_workload = True, None
    if current is not None:
        if target.queued:
            queue_served, queue_workload = cl.queue_workload(current)
        state = backend.state(current, spec["replicas"])
        pod_list = cl.pods(backend, current["metadata"]["name"])
        rank0 = _observe_rank0(_newest_rank0(backend, pod_list), state.phase, ctx.progress_port)
        if state.phase not in api.FINISHED_PHASES:
            warnings = cl.pod_warnings([p["metadata"]["name"] for p in pod_list if pods.creating(p)])

    lost_pods, lost_nodes = _lost_pods(cl, backend, pod_list or [], [w for w in stale
                                                                   if w["metadata"]["name"] in deleting])
    observed = status.Observed(backend=backend, backend_reason=backend_reason, workload=current, stale=stale,
                               service=service, progress=rank0.progress, summary=rank0.summary, state=state,
                               pods=pod_list, pod_events=warnings, progress_error=rank0.progress_error,
                               rank0_running_since=rank0.running_since, queue_workload=queue_workload,
                               queue_served=queue_served, lost_pods=lost_pods, lost_nodes=lost_nodes)
    result = status.plan(body, spec, observed, target, now)
    result.delete = [r for r in result.delete if r["name"] not in deleting]
    return _carry_out(ctx, cl, body, result, logger, restarts=restarts)


def _lost_pods(cl: Cluster, backend: backends.Backend, current_pods: list[dict[str, Any]],
               deleting: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The pods of the current workload and of older ones being deleted that sit on a lost node, and why
    each such node is lost. Only pods being deleted are looked at, so a healthy round reads no Node."""
    candidates = [p for p in current_pods if pods.terminating_unfinished(p)]
    for w in deleting:
        candidates += [p for p in cl.pods(backend, w["metadata"]["name"]) if pods.terminating_unfinished(p)]
    lost, why = [], {}
    for pod in candidates:
        node = pods.node_of(pod)
        reason = cl.node_lost(node)
        if reason:
            lost.append(pod)
            why[node] = reason
    return lost, why


def _child_refused(cl: Cluster, body: dict[str, Any], result: status.Plan, manifest: dict[str, Any],
                   made: list[dict[str, Any]], exc: ApiException, logger: Logger) -> status.Plan:
    """The Plan once the API server refused to create `manifest` (`made`: created before it)."""
    permanent = child_refusal_permanent(exc)
    child = f"{manifest['kind']} {manifest['metadata']['name']}"
    message = api_message(exc)
    metrics.ERRORS.labels(kind=f"api_{exc.status}").inc()
    logger.warning(f"the API server refused {child} (HTTP {exc.status}, "
                   f"{'permanent' if permanent else 'will retry'}): {message}")
    # If it fails: what this round made, our Service (maybe made by an earlier round; reconcile_once
    # checked it is ours), and what the Plan meant to delete anyway (older attempts' workloads).
    cleanup = list(made)
    service = (result.status.get("children") or {}).get("service")
    if service and not any(m["kind"] == "Service" for m in made) and manifest["kind"] != "Service":
        cleanup.append({"apiVersion": "v1", "kind": "Service",
                        "metadata": {"name": service, "namespace": cl.namespace}})
    cleanup += [{"apiVersion": r["apiVersion"], "kind": r["kind"],
                 "metadata": {"name": r["name"], "namespace": r["namespace"]}} for r in result.delete]
    return status.plan_child_refused(body, message, datetime.now(UTC), permanent, child=child,
                                     cleanup=cleanup)


def _carry_out(ctx: Context, cl: Cluster, body: dict[str, Any], result: status.Plan, logger: Logger,
               restarts: int = 0) -> float | None:
    """Act on a Plan; returns seconds until the next round (None: the training is gone)."""
    # Children first (creation is idempotent by name, so a crash before the status write is harmless);
    # then the status; deletions last: a restart's new attempt number must be stored before the old
    # workload goes, or a crash in between could restart the same attempt twice.
    kbody = cast(kopf.Body, body)
    refused: status.Plan | None = None
    made: list[dict[str, Any]] = []
    for manifest in result.create:
        kopf.adopt(manifest, owner=kbody)
        try:
            created = cl.create(manifest)
        except ApiException as exc:  # refused: the training ends (Failed) or waits, saying why
            refused = _child_refused(cl, body, result, manifest, made, exc, logger)
            break
        if created:
            made.append(manifest)
            logger.info(f"created {manifest['kind']} {manifest['metadata']['name']}")
        else:
            logger.info(f"{manifest['kind']} {manifest['metadata']['name']} already exists; not recreated")
    if refused is not None:
        result = refused
    new_status = result.status
    if new_status != (body.get("status") or {}):
        cl.patch_status(new_status)
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
    return next_delay(result, ctx.poll_active)


def next_delay(result: status.Plan, poll_active: float) -> float:
    """Seconds until the next round: the phase's poll, or sooner when the Plan asks (a TTL, a pending
    timeout, a stall bound, a restart): a Plan's deadline never makes the poll slower."""
    phase = result.status.get("phase")
    if phase in api.FINISHED_PHASES:
        delay = POLL_FINISHED
    elif phase == api.RUNNING or (phase == api.PENDING and result.status.get("pendingSince")):
        delay = poll_active  # running, or its pods wait: say why soon (pods are not watched)
    elif phase == api.RESTARTING or result.create or result.delete or result.force_delete:
        delay = 1.0
    else:
        delay = POLL_IDLE
    if result.requeue_after is not None:
        delay = min(delay, result.requeue_after)
    return max(0.5, delay)


def register(registry: kopf.OperatorRegistry, ctx: Context) -> None:
    """Register every handler of the operator into `registry`, bound to `ctx`."""

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Reconciliations run blocking client calls in threads: enough of them for many trainings.
        asyncio.get_running_loop().set_default_executor(
            concurrent.futures.ThreadPoolExecutor(max_workers=WORKER_THREADS, thread_name_prefix="reconcile"))
        settings.persistence.finalizer = f"{api.GROUP}/operator"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
        settings.posting.level = logging.WARNING  # our own Events go through kopf.event()
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 60
        settings.scanning.disabled = ctx.fixed_namespaces

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(ctx.api_client.configuration)

    @kopf.daemon(api.GROUP, api.VERSION, api.PLURAL, registry=registry, cancellation_timeout=10,
                 id="training")
    async def training(name: str, namespace: str | None, stopped: kopf.DaemonStopped, body: kopf.Body,
                       logger: Logger, **_: Any) -> None:
        assert namespace is not None  # PetsTraining is namespaced
        key = (namespace, name)
        trigger = ctx.triggers.setdefault(key, asyncio.Event())
        try:
            while not stopped:
                trigger.clear()
                started = time.perf_counter()
                try:
                    delay = await asyncio.to_thread(reconcile_once, ctx, namespace, name, logger)
                except ApiException as exc:
                    metrics.ERRORS.labels(kind=f"api_{exc.status}").inc()
                    metrics.RECONCILES.labels(result="error").inc()
                    detail = f"API error {exc.status} {exc.reason}: {api_message(exc)}"
                    if exc.status in (400, 422):  # a manifest the server refuses: retrying cannot help
                        kopf.warn(body, reason="Rejected", message=detail)
                        raise kopf.PermanentError(detail) from exc
                    if exc.status == 403:  # RBAC, or a namespace being deleted: may change, retry slowly
                        kopf.warn(body, reason="Forbidden", message=f"{detail}; check the operator's RBAC")
                        raise kopf.TemporaryError(detail, delay=POLL_IDLE) from exc
                    raise kopf.TemporaryError(detail, delay=2 if _transient(exc) else POLL_IDLE) from exc
                except kopf.TemporaryError:
                    metrics.ERRORS.labels(kind="temporary").inc()
                    metrics.RECONCILES.labels(result="error").inc()
                    raise
                except kopf.PermanentError:
                    metrics.ERRORS.labels(kind="permanent").inc()
                    metrics.RECONCILES.labels(result="error").inc()
                    raise
                metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)
                metrics.RECONCILES.labels(result="ok").inc()
                if delay is None:
                    return
                await _wait_any(trigger, stopped, delay)
        finally:
            if ctx.triggers.get(key) is trigger:
                del ctx.triggers[key]

    # A spec edit bumps metadata.generation past status.observedGeneration: wake the worker. A plain
    # event handler keeps no diff-base annotation on the object, so it costs no API write.
    @kopf.on.event(api.GROUP, api.VERSION, api.PLURAL, registry=registry, id=SPEC_WATCH_ID)
    def spec_changed(name: str, namespace: str | None, meta: Mapping[str, Any], status: Mapping[str, Any],
                     **_: Any) -> None:
        if namespace and meta.get("generation") != status.get("observedGeneration"):
            ctx.trigger(namespace, name)

    # Jobs are watched (always served); other backends' workloads are polled, so an operator whose
    # cluster lacks their CRD starts cleanly.
    @kopf.on.event(backends.JOB.group, backends.JOB.version, backends.JOB.plural, registry=registry,
                   labels={api.LABEL_MANAGED_BY: api.MANAGED_BY}, id=JOB_WATCH_ID)
    def job_changed(namespace: str | None, labels: Mapping[str, str], **_: Any) -> None:
        owner = labels.get(api.LABEL_TRAINING)
        if owner and namespace:
            ctx.trigger(namespace, owner)


async def _wait_any(trigger: asyncio.Event, stopped: kopf.DaemonStopped, delay: float) -> None:
    waiters = [asyncio.ensure_future(trigger.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


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
