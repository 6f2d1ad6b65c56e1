"""A training's size: the one it runs at (status.replicas), the one asked for (spec.replicas), and the
resizes between them (docs/operator.md, "Resizing a training").

A resize is a new attempt at another size, never a change of a running gang: the operator drains the
workload (its pods save a step checkpoint on SIGTERM) and builds the next one at the new size, which
resumes from that checkpoint. Three things start one:

- `Scaled`: spec.replicas changed (an edit, or `kubectl scale` through the scale subresource);
- `NodeLost`: after a node loss the gang could not be placed again within placement.nodeLostSeconds,
  and spec.elastic.minReplicas allows the size that was placed;
- `PartialAdmission`: Kueue admitted the workload at fewer pods than it was built for (its partial
  admission for Jobs), and the pods' world size must follow.

Only a user grows a training: a run made smaller goes on at that size until its attempt ends (the next
one, after a failure, a rebuild or a resume, is built at spec.replicas again) or spec.replicas changes.
A workload built from a spec since edited is rebuilt the same way (`rebuild`), at the size it asks for.
"""

from __future__ import annotations

from typing import Any

from pets_operator import api, builders, pods
from pets_operator.plan_types import Event, Plan, Round, ref
from pets_operator.spec import Spec
from pets_operator.status_types import Status
from pets_operator.timestamps import parse_timestamp, timestamp

SCALED, NODE_LOST, PARTIAL_ADMISSION = "Scaled", "NodeLost", "PartialAdmission"


def _min_replicas(spec: Spec) -> int:
    """The smallest size the operator may run the training at (unset: spec.replicas)."""
    return int((spec.elastic or {}).get("minReplicas") or spec.replicas)


def selector(r: Round) -> str:
    """status.selector: the scale subresource's label selector of the trainer pods."""
    return ",".join(f"{key}={value}" for key, value in builders.selector(r.target.name).items())


def next_size(r: Round) -> int:
    """The size the next workload is built at: the smaller one a resize by the operator chose, else
    spec.replicas."""
    spec, resize = r.spec, r.old.resize or {}
    if resize.get("reason") in (NODE_LOST, PARTIAL_ADMISSION) and int(resize.get("to") or 0) >= 1 \
            and resize.get("asked", spec.replicas) == spec.replicas:  # not scaled since: then that size
        return min(int(resize["to"]), spec.replicas)
    return spec.replicas


def current_size(r: Round) -> int:
    """status.replicas: the size of the workload there is, else of the one about to be built."""
    observed = r.observed
    if observed.workload is not None and (size := observed.backend.size(observed.workload)):
        return size
    return next_size(r)


def _keeps(spec: Spec, status: Status, size: int) -> bool:
    """The trainer can keep the training's global batch at `size` pods (status.globalBatch a multiple of
    their micro-batches); unknown (a 0.1.0 training): its trainer says so itself."""
    batch = status.global_batch
    return not batch or int(batch) % (spec.batch_size * spec.processes_per_replica * size) == 0


def _fitting(spec: Spec, status: Status, most: int) -> int | None:
    """The largest size up to `most`, and at least spec.elastic.minReplicas, that keeps the global batch."""
    return next((n for n in range(most, _min_replicas(spec) - 1, -1) if _keeps(spec, status, n)), None)


def refused(r: Round, plan: Plan) -> bool:
    """spec.replicas changed while the workload runs to a size that cannot keep the global batch: it runs
    on at its size, with one ResizeRefused Warning per refused size (the API's rule refuses such sizes
    where elastic.maxReplicas is set; without it only the global batch, fixed at the first size, says)."""
    spec, observed, status = r.spec, r.observed, plan.status
    if observed.workload is None or observed.backend.is_suspended(observed.workload) or \
            _keeps(spec, status, spec.replicas):
        status.resize_refused = None
        return False
    status.resize_refused = spec.replicas
    if r.old.resize_refused != spec.replicas:
        size = observed.backend.size(observed.workload)
        can = [n for n in range(1, 129) if _keeps(spec, status, n)]
        plan.events.append(Event("Warning", "ResizeRefused", (
            f"spec.replicas={spec.replicas} cannot keep the training's global batch {status.global_batch} "
            f"(batchSize {spec.batch_size} x processesPerReplica {spec.processes_per_replica} x a size that "
            f"divides it): sizes that keep it: {', '.join(map(str, can))}; it runs on at {size}")))
    return True


def _begin(r: Round, plan: Plan, old_size: int, new_size: int, reason: str, why: str) -> None:
    """A resize starts: one `Resized` Event ("2 -> 1"), and status.resize until the new gang runs, so the
    drain and the restart are booked as resizing time (goodput). `asked`: spec.replicas now."""
    plan.status.resize = {"from": old_size, "to": new_size, "asked": r.spec.replicas, "reason": reason,
                          "since": timestamp(r.now)}
    plan.events.append(Event("Normal", "Resized", f"{old_size} -> {new_size} ({reason}): {why}"))


def settle(r: Round, plan: Plan) -> None:
    """The new gang runs (or the training ended): the resize is over."""
    status, phase = plan.status, plan.status.phase or ""
    if status.resize and (phase == api.RUNNING or phase in api.FINISHED_PHASES):
        status.resize = None


def _scaled_message(old_size: int, new_size: int, suspended: bool) -> str:
    if suspended:
        return f"the workload is rebuilt at {new_size} when the training resumes"
    return (f"its {old_size} pod(s) stop with a step checkpoint (SIGTERM) and the next attempt resumes "
            f"from it at world size {new_size}")


def _placed_after_node_loss(r: Round, status: Status, size: int) -> int | None:
    """After a node loss, a gang that still has pods unplaced placement.nodeLostSeconds after it began
    to wait goes on at the size that was placed, where spec.elastic.minReplicas allows it (None: wait)."""
    spec, observed, now = r.spec, r.observed, r.now
    failure = status.last_failure or {}
    if _min_replicas(spec) >= size or failure.get("cause") != "NodeLost":
        return None
    since = status.pending_since
    pod_list = observed.pods or []
    if not since or len(pod_list) < size:
        return None
    if failure.get("time") and parse_timestamp(since) < parse_timestamp(failure["time"]):
        return None  # a wait from before the loss
    waited = (now - parse_timestamp(since)).total_seconds()
    if waited < int(spec.placement.get("nodeLostSeconds", 30)):
        return None
    placed = sum(1 for p in pod_list if pods.scheduled_at(p) or pods.node_of(p))
    return None if placed >= size else _fitting(spec, status, placed)


def _built_size(workload: dict[str, Any]) -> int | None:
    """The world size the workload's pods were built for (its annotation; None on a 0.1.0 workload). A
    queue's partial admission lowers the Job's parallelism, not this."""
    annotations = (workload.get("metadata") or {}).get("annotations") or {}
    return int(annotations.get(builders.ANNOTATION_WORLD_SIZE) or 0) or None


def _admitted_smaller(r: Round, status: Status) -> int | None:
    """Kueue admitted the workload at fewer pods than its pods were built for (partial admission sets
    the Job's parallelism and completions, not the pods' world size): the size to rebuild it at."""
    spec, observed = r.spec, r.observed
    workload = observed.workload
    if workload is None or observed.backend.is_suspended(workload):
        return None
    built_for = _built_size(workload)
    size = observed.backend.size(workload)
    if built_for and size and size < built_for:
        return _fitting(spec, status, size)  # Kueue admits the smaller one whole
    return None


def rebuild(r: Round, plan: Plan) -> bool:
    """Whether the running workload is replaced, as a new attempt that is not a restart: it was built
    from a spec since edited (unless the edit's size is refused), or the cluster has room for fewer pods
    than it has and spec.elastic allows going on with them."""
    assert r.state is not None and r.observed.workload is not None
    if r.state.phase in api.FINISHED_PHASES:
        return False
    if _built_from_older_spec(r.observed.workload, r.spec) and not refused(r, plan):
        _rebuild(r, plan)
        return True
    if (smaller := _smaller(r, plan)) is not None:
        _rebuild(r, plan, smaller)
        return True
    return False


def _built_from_older_spec(workload: dict[str, Any], spec: Spec) -> bool:
    """The workload was built from a spec since edited (while it was suspended or queued). A workload
    from before the annotation existed is taken as current."""
    built_from = ((workload.get("metadata") or {}).get("annotations") or {}).get(api.ANNOTATION_SPEC_DIGEST)
    return bool(built_from) and built_from != builders.spec_digest(spec)


def _smaller(r: Round, plan: Plan) -> tuple[int, str, str] | None:
    """The cluster has room for fewer pods than the workload's, and spec.elastic allows going on with
    them: the size, the reason and why."""
    status = plan.status
    size = _built_size(r.observed.workload or {}) or int(status.replicas or 0)
    if (admitted := _admitted_smaller(r, status)) is not None:
        return admitted, PARTIAL_ADMISSION, (f"Kueue admitted {admitted} of the {size} pods the workload's "
                                             f"pods were built for; rebuilt at world size {admitted}")
    waiting = r.old.phase in (api.PENDING, api.RESTARTING)
    if r.target.queued or not waiting or r.observed.backend.is_suspended(r.observed.workload or {}):
        return None
    if (placed := _placed_after_node_loss(r, status, size)) is not None:
        seconds = r.spec.placement.get("nodeLostSeconds", 30)
        return placed, NODE_LOST, (f"after a node was lost only {placed} of {size} pods were placed within "
                                   f"spec.placement.nodeLostSeconds={seconds}; going on at {placed} "
                                   f"(spec.elastic.minReplicas={_min_replicas(r.spec)}) until this "
                                   "attempt ends or spec.replicas changes")
    return None


def _rebuild(r: Round, plan: Plan, smaller: tuple[int, str, str] | None = None) -> None:
    """No edit is lost: a workload built from an older spec is replaced by one built from this spec, as a
    new attempt that is not a restart (nothing failed). Checkpoints carry over where their shape allows
    (`builders.checkpoint_dir`). `smaller`: the cluster has room for fewer pods, and the workload is
    rebuilt at that size for the same spec."""
    status, spec, observed, target = plan.status, r.spec, r.observed, r.target
    assert observed.workload is not None
    old_size = int(_built_size(observed.workload) or observed.backend.size(observed.workload)
                   or spec.replicas)
    active = bool(status.workload_active)
    # The workload goes (its pods stop with the SIGTERM save), and the next attempt is made once it is gone.
    status.attempt = target.attempt + 1
    policy = {k: v for k, v in (status.children or {}).items() if k == "networkPolicy"}  # one for all
    status.children = observed.backend.children_names(target.name, target.attempt + 1) | policy
    plan.delete.append(ref(observed.workload))
    plan.requeue_after = 0.0
    status.workload_active = False
    if smaller is not None:
        size, reason, why = smaller
        _begin(r, plan, old_size, size, reason, why)
        plan.verdict = (api.QUEUED if target.queued else api.PENDING, "Resizing",
                        f"resizing {old_size} -> {size}: {why}")
        return
    if old_size != spec.replicas:
        if active and not spec.suspend:
            _begin(r, plan, old_size, spec.replicas, SCALED, _scaled_message(old_size, spec.replicas, False))
        else:
            status.resize = None
            plan.events.append(Event("Normal", "Resized", f"{old_size} -> {spec.replicas} ({SCALED}): "
                                     + _scaled_message(old_size, spec.replicas, True)))
    kind, name = observed.workload["kind"], observed.workload["metadata"]["name"]
    message = (f"spec changed (generation {r.generation}) since {kind} {name} was built: "
               "rebuilding it from the new spec")
    if active and spec.suspend:  # edited as it was being suspended
        message += "; its pods stop now, and the rebuilt workload starts on resume"
    elif active:
        message += "; its pods restart from the newest checkpoint of this shape (not counted as a restart)"
    plan.events.append(Event("Normal", "Rebuilding", message))
    phase = (api.SUSPENDED if spec.suspend else api.QUEUED if target.queued
             else api.RESTARTING if r.old.phase == api.RESTARTING else api.PENDING)
    plan.verdict = (phase, "Rebuilding", message)
