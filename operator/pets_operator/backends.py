"""Each workload backend as one object: where its API lives, what it builds, how its state reads.

A backend is the kind of object that runs the gang of trainer pods. The Indexed Job (with a headless
Service for stable pod names) is always there; a Kubeflow PyTorchJob is used where the training-operator's
CRD is served. Everything that differs between them is answered here and nowhere else: builders, the
status planner, the handlers and `render` ask the backend. A third backend (JobSet, say) is one more
subclass and one more entry in `BACKENDS`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pets_contract import names
from pets_operator import api, builders, children
from pets_operator.spec import Spec
from pets_operator.status_types import Status
from pets_operator.timestamps import parse_timestamp, timestamp


class BackendUnavailable(api.SpecError):
    """The spec asks for a backend whose API the cluster does not serve (yet): the training waits."""


@dataclass(frozen=True)
class WorkloadState:
    """What a workload's own status says, in PetsTraining terms."""

    phase: str  # one of api.PHASES (never Restarting: that is the operator's decision)
    reason: str
    message: str
    active: int = 0
    ready: int = 0
    start_time: str | None = None
    completion_time: str | None = None


def _norm_ts(text: Any) -> str | None:
    """A timestamp from a child's status, written back in the API server's own form."""
    return timestamp(parse_timestamp(str(text))) if text else None


def _true_conditions(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in (workload.get("status") or {}).get("conditions") or []
            if c.get("status") == "True"}


class Backend:
    """The interface every backend answers. Subclasses are stateless singletons."""

    name: ClassVar[str]  # the value of spec.backend / status.backend
    group: ClassVar[str]
    version: ClassVar[str]
    plural: ClassVar[str]
    kind: ClassVar[str]
    children_key: ClassVar[str]  # the key of status.children that names the workload
    uses_service: ClassVar[bool]  # whether the operator creates the headless Service
    always_served: ClassVar[bool]  # built into Kubernetes: no discovery needed
    install_hint: ClassVar[str] = ""  # what to install when its API is not served
    # The workload's failure reason when its own failure policy ended it on the trainer's
    # permanent-error exit code ("" where the backend has no such policy: the operator reads the pods).
    permanent_reason: ClassVar[str] = ""
    # The workload's failure reason when its own failure policy ended it because the cluster disrupted
    # a pod ("" where the backend has no such policy: the operator reads the pods).
    disrupted_reason: ClassVar[str] = ""
    container: ClassVar[str] = builders.CONTAINER  # the trainer container's name in its pods

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def build_workload(self, spec: Spec, target: builders.Target) -> dict[str, Any]:
        raise NotImplementedError

    def state(self, workload: dict[str, Any], replicas: int) -> WorkloadState:
        raise NotImplementedError

    def pods_selector(self, workload_name: str) -> str:
        """Label selector of every pod of the workload."""
        raise NotImplementedError

    def rank_of(self, pod: dict[str, Any]) -> int | None:
        """A pod's machine rank, from the labels its controller sets."""
        raise NotImplementedError

    def suspend_patch(self, value: bool) -> dict[str, Any]:
        raise NotImplementedError

    def is_suspended(self, workload: dict[str, Any]) -> bool:
        raise NotImplementedError

    def size(self, workload: dict[str, Any]) -> int | None:
        """The pods the workload runs (a queue may have admitted fewer than it was built with)."""
        raise NotImplementedError

    def build_service(self, spec: Spec, target: builders.Target) -> dict[str, Any] | None:
        return children.build_service(spec, target) if self.uses_service else None

    def children(self, spec: Spec, target: builders.Target) -> list[dict[str, Any]]:
        """Everything one attempt needs, in creation order (the Service, the NetworkPolicy, the managed
        output claim and the dataset cache claim before the pods that use them)."""
        service = self.build_service(spec, target)
        policy = children.build_network_policy(spec, target)
        claim = children.build_output_claim(spec, target)
        cache = children.build_dataset_cache_claim(spec, target)
        return [c for c in (service, policy, claim, cache) if c] + [self.build_workload(spec, target)]

    def children_names(self, name: str, attempt: int) -> dict[str, str]:
        """status.children for one attempt."""
        names = {"service": builders.service_name(name)} if self.uses_service else {}
        return names | {self.children_key: builders.job_name(name, attempt)}


class JobBackend(Backend):
    """An Indexed Job (rank = completion index) and a headless Service for `<job>-<index>.<svc>`."""

    name, group, version, plural, kind = "job", "batch", "v1", "jobs", "Job"
    children_key, uses_service, always_served = "job", True, True
    permanent_reason = "PodFailurePolicy"
    disrupted_reason = "PodDisrupted"

    def build_workload(self, spec: Spec, target: builders.Target) -> dict[str, Any]:
        return children.build_job(spec, target)

    def state(self, workload: dict[str, Any], replicas: int) -> WorkloadState:
        conds = _true_conditions(workload)
        st = workload.get("status") or {}
        active, ready = int(st.get("active") or 0), int(st.get("ready") or 0)
        start, done = _norm_ts(st.get("startTime")), _norm_ts(st.get("completionTime"))
        if c := conds.get("Complete") or conds.get("SuccessCriteriaMet"):
            return WorkloadState(api.SUCCEEDED, "JobComplete", c.get("message") or
                                 f"all {replicas} ranks finished", active, ready, start, done)
        if c := conds.get("Failed") or conds.get("FailureTarget"):
            reason = c.get("reason") or "JobFailed"
            if reason == self.permanent_reason and "DisruptionTarget" in str(c.get("message")):
                reason = self.disrupted_reason  # children.build_job's second rule, not the exit code
            return WorkloadState(api.FAILED, reason, c.get("message") or f"Job failed ({reason})",
                                 active, ready, start, _norm_ts(c.get("lastTransitionTime")))
        if self.is_suspended(workload) or "Suspended" in conds:
            return WorkloadState(api.SUSPENDED, "JobSuspended", "the Job is suspended", active, ready, start)
        if active > 0:
            return WorkloadState(api.RUNNING, "PodsRunning",
                                 f"{ready}/{replicas} pods ready, {active} active", active, ready, start)
        return WorkloadState(api.PENDING, "WaitingForPods", "waiting for the Job's pods",
                             active, ready, start)

    def pods_selector(self, workload_name: str) -> str:
        return f"{names.JOB_NAME_LABEL}={workload_name}"

    def rank_of(self, pod: dict[str, Any]) -> int | None:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        index = labels.get(names.JOB_INDEX_LABEL)
        return int(index) if index and index.isdigit() else None

    def suspend_patch(self, value: bool) -> dict[str, Any]:
        return {"spec": {"suspend": value}}

    def is_suspended(self, workload: dict[str, Any]) -> bool:
        return bool((workload.get("spec") or {}).get("suspend"))

    def size(self, workload: dict[str, Any]) -> int | None:
        spec = workload.get("spec") or {}
        return int(spec.get("completions") or spec.get("parallelism") or 0) or None


class PyTorchJobBackend(Backend):
    """A Kubeflow PyTorchJob (kubeflow.org/v1): one Master and replicas-1 Workers, same launcher.

    The training-operator injects MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE and gives the Master a
    Service of its own, so the operator sets no main address and creates no Service.
    """

    name, group, version, plural, kind = "pytorchjob", "kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"
    children_key, uses_service, always_served = "pytorchJob", False, False
    install_hint = "install the Kubeflow training-operator"
    container = names.TRAINER_CONTAINERS[1]  # "pytorch": the container name the training-operator looks for
    PORT_NAME = "pytorchjob-port"  # the port name it reads the rendezvous port from

    def build_workload(self, spec: Spec, target: builders.Target) -> dict[str, Any]:
        template = builders.pod_template(spec, target, container_name=self.container,
                                         port_name=self.PORT_NAME, headless_service=False)
        replica_specs: dict[str, Any] = {
            "Master": {"replicas": 1, "restartPolicy": "Never", "template": template},
        }
        if spec.replicas > 1:
            replica_specs["Worker"] = {"replicas": spec.replicas - 1, "restartPolicy": "Never",
                                       "template": copy.deepcopy(template)}
        run_policy: dict[str, Any] = {"cleanPodPolicy": "None", "backoffLimit": 0,
                                      "suspend": builders.created_suspended(spec, target)}
        if (deadline := builders.attempt_deadline(spec, target)) is not None:
            run_policy["activeDeadlineSeconds"] = deadline
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "metadata": builders.workload_metadata(spec, target),
            "spec": {"runPolicy": run_policy, "pytorchReplicaSpecs": replica_specs},
        }

    def state(self, workload: dict[str, Any], replicas: int) -> WorkloadState:
        conds = _true_conditions(workload)
        st = workload.get("status") or {}
        rstat = st.get("replicaStatuses") or {}
        active = sum(int((v or {}).get("active") or 0) for v in rstat.values())
        start, done = _norm_ts(st.get("startTime")), _norm_ts(st.get("completionTime"))
        if "Succeeded" in conds:
            return WorkloadState(api.SUCCEEDED, "PyTorchJobSucceeded", conds["Succeeded"].get("message") or
                                 "PyTorchJob succeeded", active, active, start, done)
        if c := conds.get("Failed"):
            return WorkloadState(api.FAILED, c.get("reason") or "PyTorchJobFailed",
                                 c.get("message") or "PyTorchJob failed", active, active, start,
                                 done or _norm_ts(c.get("lastTransitionTime")))
        if "Suspended" in conds or self.is_suspended(workload):
            return WorkloadState(api.SUSPENDED, "PyTorchJobSuspended", "the PyTorchJob is suspended",
                                 active, active, start)
        if "Running" in conds or active > 0:
            return WorkloadState(api.RUNNING, "PodsRunning", f"{active}/{replicas} pods active",
                                 active, active, start)
        return WorkloadState(api.PENDING, "WaitingForPods", "waiting for the PyTorchJob's pods", active,
                             active, start)

    def pods_selector(self, workload_name: str) -> str:
        return f"{names.KUBEFLOW_JOB_NAME_LABEL}={workload_name}"

    def rank_of(self, pod: dict[str, Any]) -> int | None:
        """The Master is rank 0; Worker i is rank i + 1 (as the training-operator sets RANK)."""
        labels = (pod.get("metadata") or {}).get("labels") or {}
        kind, index = labels.get(names.KUBEFLOW_REPLICA_TYPE_LABEL), labels.get(
            names.KUBEFLOW_REPLICA_INDEX_LABEL, "")
        if not index.isdigit():
            return None
        return int(index) + (0 if kind == "master" else 1)

    def suspend_patch(self, value: bool) -> dict[str, Any]:
        return {"spec": {"runPolicy": {"suspend": value}}}

    def is_suspended(self, workload: dict[str, Any]) -> bool:
        return bool(((workload.get("spec") or {}).get("runPolicy") or {}).get("suspend"))

    def size(self, workload: dict[str, Any]) -> int | None:
        specs = (workload.get("spec") or {}).get("pytorchReplicaSpecs") or {}
        return sum(int((s or {}).get("replicas") or 0) for s in specs.values()) or None


JOB = JobBackend()
PYTORCHJOB = PyTorchJobBackend()
BACKENDS: dict[str, Backend] = {b.name: b for b in (JOB, PYTORCHJOB)}
# What `backend: auto` means unless the operator is told otherwise (--auto-backend, the chart's
# autoBackend): the Indexed Job, built into every cluster, admitted by Kueue without extra set-up, and
# the backend whose permanent errors end at once (its pod failure policy). Installing Kubeflow does not
# silently move every training to a PyTorchJob; a platform team opts in once, for all its trainings.
DEFAULT_AUTO = JOB.name


def get(name: str) -> Backend:
    """The backend recorded in status.backend (or named in spec.backend)."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise api.SpecError(f"spec.backend must be one of {', '.join(['auto', *BACKENDS])}, "
                            f"got {name!r}") from None


def for_kind(api_version: str, kind: str) -> Backend | None:
    """The backend whose workload has this apiVersion/kind (None for other children, e.g. a Service)."""
    return next((b for b in BACKENDS.values() if (b.api_version, b.kind) == (api_version, kind)), None)


def resolve(spec: Spec, served: set[str], auto: str = DEFAULT_AUTO) -> Backend:
    """spec.backend -> the backend to use, given the names of the backends whose API is served.

    `auto` is the operator's `auto` backend where its API is served, else the Job; a named backend that
    is not served raises BackendUnavailable (the training waits: the CRD may be installed later).
    """
    wanted = spec.backend
    if wanted == "auto":
        preferred = get(auto)
        return preferred if preferred.always_served or preferred.name in served else JOB
    backend = get(wanted)
    if not backend.always_served and backend.name not in served:
        raise BackendUnavailable(
            f"spec.backend is {wanted!r} but the {backend.group} {backend.kind} CRD is not installed; "
            f"{backend.install_hint} or use backend 'job'")
    return backend


def why(spec: Spec, backend: Backend, auto: str = DEFAULT_AUTO) -> str:
    """Why `resolve` chose `backend`, in words for status and an Event."""
    if spec.backend != "auto":
        return f"spec.backend is {backend.name}"
    if backend.name == auto:
        return f"spec.backend is auto, which this operator runs as {auto} (its --auto-backend)"
    return (f"spec.backend is auto; this operator prefers {auto} (its --auto-backend), but the "
            f"{get(auto).kind} CRD is not served, so {backend.name}")


def keep_or_choose(spec: Spec, old_status: Status, served: Callable[[], set[str]],
                   auto: str) -> tuple[Backend, str]:
    """The backend and why. `auto` is decided once, then kept in status.backend; `served` (discovery) is
    asked only while undecided, and never for a built-in backend (one call per reconcile was a fifth of
    the idle requests at scale: docs/scale.md)."""
    if spec.backend == "auto" and old_status.backend in BACKENDS:
        return get(str(old_status.backend)), str(old_status.backend_reason or "")
    builtin = spec.backend != "auto" and get(spec.backend).always_served
    backend = resolve(spec, set() if builtin else served(), auto)
    return backend, why(spec, backend, auto)
