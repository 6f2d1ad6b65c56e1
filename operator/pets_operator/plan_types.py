"""The planner's vocabulary: what the operator observed for one PetsTraining (Observed), what it
decided (Plan, with its Events), and the small helpers every policy writes the status with."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pets_operator.backends import Backend, WorkloadState, timestamp
from pets_operator.status_types import Status


@dataclass(frozen=True)
class EndedRun:
    """A run of rank 0 that ended as its pod went (ended_runs.py): its attempt, when its container
    started (which tells the runs of one attempt apart), its summary, and the world size it ran at."""

    attempt: int
    started: str
    summary: dict[str, Any]
    world_size: int | None = None


@dataclass(frozen=True)
class Observed:
    """What the operator saw in the cluster for one PetsTraining."""

    backend: Backend  # already resolved
    workload: dict[str, Any] | None  # the current attempt's workload
    stale: list[dict[str, Any]] = field(default_factory=list)  # workloads of older attempts
    service: dict[str, Any] | None = None  # the headless Service (backends that use one)
    progress: dict[str, float] | None = None  # rank 0's gauges, parsed (see progress.py)
    summary: dict[str, Any] | None = None  # rank 0's termination message, parsed
    state: WorkloadState | None = None  # `backend.state(workload)`, read once by the observer
    pods: list[dict[str, Any]] | None = None  # the current attempt's pods (None: not observed)
    pod_events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # Warning Events by pod
    # The workload's FailedCreate Events (read only while some of its pods do not exist)
    workload_refusals: list[dict[str, Any]] = field(default_factory=list)
    progress_error: str | None = None  # why rank 0's progress endpoint could not be read
    progress_failing_since: datetime | None = None  # since when (None: taken as confirmed)
    progress_read_at: datetime | None = None  # when rank 0's gauges were read (None: not known)
    rank0_running_since: str | None = None  # when rank 0's trainer container started
    queue_workload: dict[str, Any] | None = None  # Kueue's Workload for the current workload (queued ones)
    queue_served: bool = True  # whether Kueue's Workload API is served at all
    backend_reason: str = ""  # why that backend (backends.why)
    # Why the output, where spec.output is unset (OUTPUT_REASONS; "": the spec says)
    output_reason: str = ""
    output_claim: dict[str, Any] | None = None  # the output claim, read while a pod waits to be scheduled
    # The claims the operator made that the pods wait for, with their class (claim_binding), by name
    unbound_claims: dict[str, str] = field(default_factory=dict)
    # Pods of this training (the current workload's, or a deleting older one's) stuck on a lost node
    # (`pods.terminating_unfinished` on a node `pods.node_lost` calls lost), and why each node is lost.
    lost_pods: list[dict[str, Any]] = field(default_factory=list)
    lost_nodes: dict[str, str] = field(default_factory=dict)
    # Rank 0's runs that ended as their pods went (ended_runs.py), whose summaries a round books
    ended_runs: tuple[EndedRun, ...] = ()


@dataclass
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Plan:
    status: Status
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[dict[str, Any]] = field(default_factory=list)  # objects (kind/name/namespace)
    force_delete: list[dict[str, str]] = field(default_factory=list)  # pods (name, uid) on lost nodes
    suspend: bool | None = None  # set the workload's suspend to this
    suspend_workload: str | None = None  # the workload whose suspend to set
    queue_active: bool | None = None  # set Kueue's Workload spec.active to this (queued trainings)
    queue_workload: str | None = None  # the Kueue Workload to set it on
    events: list[Event] = field(default_factory=list)
    delete_self: bool = False  # TTL after finish expired
    requeue_after: float | None = None  # seconds until the plan should be made again at the latest


def set_condition(st: Status, ctype: str, status: bool | None, reason: str, message: str, now: datetime,
                  generation: int | None) -> None:
    value = "Unknown" if status is None else "True" if status else "False"
    if st.conditions is None:
        st.conditions = []
    cond = next((c for c in st.conditions if c["type"] == ctype), None)
    if cond is None:
        cond = {"type": ctype}
        st.conditions.append(cond)
    if cond.get("status") != value:
        cond["lastTransitionTime"] = timestamp(now)
    cond.update(status=value, reason=reason, message=message)
    if generation is not None:
        cond["observedGeneration"] = generation


def merge_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns the stored status `old` into the planned `new`: a key
    `new` lacks is null, so a key the plan removed (status.pop) is removed from the stored status too,
    which a patch of `new` itself would keep. Written here rather than taken from a library: ten lines,
    and no package of ours has it."""
    patch: dict[str, Any] = {key: None for key in old.keys() - new.keys()}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            if inner := merge_patch(before, value):
                patch[key] = inner
        elif key not in old or value != before:
            patch[key] = value
    return patch


def ref(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "name": meta.get("name"),
            "namespace": meta.get("namespace")}
