"""The planner's vocabulary: what the operator observed for one PetsTraining (Observed), the round every
policy reads (Round: the spec, the stored status, what was observed, the target, the time), what it
decided (Plan, with its Events), and the small helpers every policy writes the status with."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pets_operator.backends import Backend, WorkloadState
from pets_operator.builders import Target
from pets_operator.defaults import DEFAULT_PROGRESS_INTERVAL
from pets_operator.spec import Spec
from pets_operator.status_types import Status
from pets_operator.timestamps import timestamp

Verdict = tuple[str, str, str]  # a phase, with its reason and message, as a policy decides it


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
    foreign_service: dict[str, Any] | None = None  # a Service of its name that another object controls
    progress: dict[str, float] | None = None  # rank 0's gauges, parsed (see progress.py)
    summary: dict[str, Any] | None = None  # rank 0's termination message, parsed
    state: WorkloadState | None = None  # `backend.state(workload)`, read once by the observer
    pods: list[dict[str, Any]] | None = None  # the current attempt's pods (None: not observed)
    pod_events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # Warning Events by pod
    # The workload's FailedCreate Events (read only while some of its pods do not exist)
    workload_refusals: list[dict[str, Any]] = field(default_factory=list)
    progress_error: str | None = None  # why rank 0's progress endpoint could not be read
    progress_unreachable: bool = False  # it could not be reached at all (else it answered, refused)
    progress_failing_since: datetime | None = None  # since when (None: taken as confirmed)
    progress_read_at: datetime | None = None  # when rank 0's gauges were read (None: not known)
    rank0_running_since: str | None = None  # when rank 0's trainer container started
    queue_workload: dict[str, Any] | None = None  # Kueue's Workload for the current workload (queued ones)
    queue_served: bool = True  # whether Kueue's Workload API is served at all
    backend_reason: str = ""  # why that backend (backends.why)
    # Why the output, where spec.output is unset (OUTPUT_REASONS; "": the spec says)
    output_reason: str = ""
    output_claim: dict[str, Any] | None = None  # the output claim, read while a pod waits to be scheduled
    # The claims the operator makes, by name, as read before the workload is made (None: not made yet),
    # and the cluster's StorageClasses where one of them is not bound (None: not read, or not allowed)
    claims: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    storage_classes: list[dict[str, Any]] | None = None
    # Pods of this training (the current workload's, or a deleting older one's) stuck on a lost node
    # (`pods.terminating_unfinished` on a node `pods.node_lost` calls lost), and why each node is lost.
    lost_pods: list[dict[str, Any]] = field(default_factory=list)
    lost_nodes: dict[str, str] = field(default_factory=dict)
    # Pods stuck terminating on a node not (yet) called lost: each round looks at their nodes again
    stuck_pods: int = 0
    # Older attempts' workloads being deleted for less than reconcile.DELETING_RECHECK: not deleted again
    deleting: frozenset[str] = frozenset()
    # Rank 0's runs that ended as their pods went (ended_runs.py), whose summaries a round books
    ended_runs: tuple[EndedRun, ...] = ()


@dataclass(frozen=True)
class Refused:
    """A child the API server refused to create this round ("Job pets-r0"), in its words: whether a retry
    can help, and what the round made before it."""

    child: str
    message: str
    permanent: bool
    made: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Round:
    """One round for one training, as every policy reads it (`policy(r, plan)`): the spec, the status as
    stored (`old`), what was observed, the target its children are built for, and the time. `state` is
    the workload's state with its pods' word (every rank succeeded): plan() reads it first.

    A round whose spec cannot run has no `spec` (`spec_error` says why) or no backend (`backend_error`),
    and nothing observed; one whose child the API server refused (`refused`) is planned again."""

    old: Status
    observed: Observed
    target: Target
    now: datetime
    meta: Mapping[str, Any] = field(default_factory=dict)  # the training's metadata
    stored: Mapping[str, Any] = field(default_factory=dict)  # the status as stored, as the API gave it
    resolved: Spec | None = None
    spec_error: str | None = None
    backend_error: str | None = None
    refused: Refused | None = None
    progress_interval: float = DEFAULT_PROGRESS_INTERVAL  # how often a running training is looked at
    written_ago: float = math.inf  # seconds since this operator last wrote the training's status
    state: WorkloadState | None = None  # None: no workload (or plan() has not read it yet)

    @classmethod
    def of(cls, body: Mapping[str, Any], spec: Spec | None, observed: Observed, target: Target,
           now: datetime, **more: Any) -> Round:
        """The round of a stored training (`body`: the object as the API server holds it)."""
        stored = body.get("status") or {}
        return cls(Status.from_dict(stored), observed, target, now, body.get("metadata") or {}, stored,
                   spec, **more)

    @property
    def spec(self) -> Spec:
        assert self.resolved is not None, "a round without a spec plans only its refusal"
        return self.resolved

    @property
    def generation(self) -> int | None:
        return self.meta.get("generation")

    @property
    def created(self) -> str | None:
        return self.meta.get("creationTimestamp")

    @property
    def restarts(self) -> int:
        return int(self.old.restarts or 0)


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
    verdict: Verdict | None = None  # the phase decided, until conditions.apply_phase writes it
    requeue_after: float | None = None  # seconds until the plan should be made again at the latest
    # What the round comes to (pacing.py): nothing done now, the status write being held back; the
    # seconds until the next round at the latest (None: none needed); whether a restart was counted
    hold: bool = False
    next_round: float | None = None
    restarted: bool = False
    conflict: str | None = None  # a child of ours by name is someone else's: nothing done, tried again


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
