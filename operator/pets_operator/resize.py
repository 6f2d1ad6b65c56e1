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
Pure functions on the typed status and the observed children; time is passed in.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pets_operator import api, builders, pods
from pets_operator.backends import parse_timestamp, timestamp
from pets_operator.plan_types import Event, Observed, Plan
from pets_operator.spec import Spec
from pets_operator.status_types import Status

SCALED, NODE_LOST, PARTIAL_ADMISSION = "Scaled", "NodeLost", "PartialAdmission"


def min_replicas(spec: Spec) -> int:
    """The smallest size the operator may run the training at (unset: spec.replicas)."""
    return int((spec.elastic or {}).get("minReplicas") or spec.replicas)


def selector(name: str) -> str:
    """status.selector: the scale subresource's label selector of the trainer pods."""
    return ",".join(f"{key}={value}" for key, value in builders.selector(name).items())


def next_size(spec: Spec, status: Status) -> int:
    """The size the next workload is built at: the smaller one a resize by the operator chose, else
    spec.replicas."""
    resize = status.resize or {}
    if resize.get("reason") in (NODE_LOST, PARTIAL_ADMISSION) and int(resize.get("to") or 0) >= 1 \
            and resize.get("asked", spec.replicas) == spec.replicas:  # not scaled since: then that size
        return min(int(resize["to"]), spec.replicas)
    return spec.replicas


def current_size(spec: Spec, observed: Observed, status: Status) -> int:
    """status.replicas: the size of the workload there is, else of the one about to be built."""
    if observed.workload is not None and (size := observed.backend.size(observed.workload)):
        return size
    return next_size(spec, status)


def keeps(spec: Spec, status: Status, size: int) -> bool:
    """The trainer can keep the training's global batch at `size` pods (status.globalBatch a multiple of
    their micro-batches); unknown (a 0.1.0 training): its trainer says so itself."""
    batch = status.global_batch
    return not batch or int(batch) % (spec.batch_size * spec.processes_per_replica * size) == 0


def fitting(spec: Spec, status: Status, most: int) -> int | None:
    """The largest size up to `most`, and at least spec.elastic.minReplicas, that keeps the global batch."""
    return next((n for n in range(most, min_replicas(spec) - 1, -1) if keeps(spec, status, n)), None)


def refused(result: Plan, spec: Spec, observed: Observed, old: Status) -> bool:
    """spec.replicas changed while the workload runs to a size that cannot keep the global batch: it runs
    on at its size, with one ResizeRefused Warning per refused size (the API's rule refuses such sizes
    where elastic.maxReplicas is set; without it only the global batch, fixed at the first size, says)."""
    status = result.status
    if observed.workload is None or observed.backend.is_suspended(observed.workload) or \
            keeps(spec, status, spec.replicas):
        status.resize_refused = None
        return False
    status.resize_refused = spec.replicas
    if old.resize_refused != spec.replicas:
        size = observed.backend.size(observed.workload)
        can = [n for n in range(1, 129) if keeps(spec, status, n)]
        result.events.append(Event("Warning", "ResizeRefused", (
            f"spec.replicas={spec.replicas} cannot keep the training's global batch {status.global_batch} "
            f"(batchSize {spec.batch_size} x processesPerReplica {spec.processes_per_replica} x a size that "
            f"divides it): sizes that keep it: {', '.join(map(str, can))}; it runs on at {size}")))
    return True


def begin(result: Plan, old_size: int, new_size: int, asked: int, reason: str, why: str,
          now: datetime) -> None:
    """A resize starts: one `Resized` Event ("2 -> 1"), and status.resize until the new gang runs, so the
    drain and the restart are booked as resizing time (goodput). `asked`: spec.replicas then."""
    result.status.resize = {"from": old_size, "to": new_size, "asked": asked, "reason": reason,
                               "since": timestamp(now)}
    result.events.append(Event("Normal", "Resized", f"{old_size} -> {new_size} ({reason}): {why}"))


def settle(status: Status, phase: str) -> None:
    """The new gang runs (or the training ended): the resize is over."""
    if status.resize and (phase == api.RUNNING or phase in api.FINISHED_PHASES):
        status.resize = None


def scaled_message(old_size: int, new_size: int, suspended: bool) -> str:
    if suspended:
        return f"the workload is rebuilt at {new_size} when the training resumes"
    return (f"its {old_size} pod(s) stop with a step checkpoint (SIGTERM) and the next attempt resumes "
            f"from it at world size {new_size}")


def placed_after_node_loss(spec: Spec, observed: Observed, status: Status, size: int,
                           now: datetime) -> int | None:
    """After a node loss, a gang that still has pods unplaced placement.nodeLostSeconds after it began
    to wait goes on at the size that was placed, where spec.elastic.minReplicas allows it (None: wait)."""
    failure = status.last_failure or {}
    if min_replicas(spec) >= size or failure.get("cause") != "NodeLost":
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
    return None if placed >= size else fitting(spec, status, placed)


def built_size(workload: dict[str, Any]) -> int | None:
    """The world size the workload's pods were built for (its annotation; None on a 0.1.0 workload). A
    queue's partial admission lowers the Job's parallelism, not this."""
    annotations = (workload.get("metadata") or {}).get("annotations") or {}
    return int(annotations.get(builders.ANNOTATION_WORLD_SIZE) or 0) or None


def admitted_smaller(spec: Spec, observed: Observed, status: Status) -> int | None:
    """Kueue admitted the workload at fewer pods than its pods were built for (partial admission sets
    the Job's parallelism and completions, not the pods' world size): the size to rebuild it at."""
    workload = observed.workload
    if workload is None or observed.backend.is_suspended(workload):
        return None
    built_for = built_size(workload)
    size = observed.backend.size(workload)
    if built_for and size and size < built_for:
        return fitting(spec, status, size)  # Kueue admits the smaller one whole
    return None
