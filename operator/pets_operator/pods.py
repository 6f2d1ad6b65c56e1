"""Pure reading of a training's pods: why they wait, and why one failed.

Kubernetes says why a pod waits in three places: the PodScheduled condition (the scheduler's
message: insufficient CPU, no node matching the selector, a claim that does not exist), the
containers' `waiting` state (image pulls, container config), and, for volumes that cannot be
mounted, only in the pod's Warning Events (FailedMount). These functions turn that into one
reason per pod and pick the worst, so the PetsTraining's status says what the pods are doing.
Nothing here talks to the API server.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pets_contract import exits
from pets_contract.redact import redact_urls

DATASET_INIT = "dataset"  # the init container that fetches spec.dataset.url (builders.dataset_init_container)

IMAGE_PULL_REASONS = {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"}
CONFIG_REASONS = {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
# Pod conditions and reasons that mean the cluster, not the training, ended the pod.
DISRUPTION_REASONS = {"Evicted", "Preempted", "NodeLost", "Shutdown", "Terminated", "NodeShutdown"}

# Worst first: a user error that waiting cannot fix, then what may resolve itself.
SEVERITY = ["PodCreateRefused", "ImagePullFailed", "ContainerConfigError", "VolumeNotReady", "Unschedulable",
            "FetchingDataset", "ContainerCreating", "WaitingForPods"]
LOG_TAIL_LINES = 20
# The trainer's summary is one flat object (docs/contract.md). A 4 KiB termination message can nest 4000
# deep: past the interpreter's recursion limit json.loads raises RecursionError (found by the property
# tests, issue 28), and a summary a few hundred deep still breaks the recursive deepcopy and JSON encoding
# of the status patch on every round. So a summary nested deeper than this is unreadable.
SUMMARY_MAX_DEPTH = 32
_CLAIM = re.compile(r'persistentvolumeclaim "([^"]+)"')


@dataclass(frozen=True)
class Waiting:
    """Why one pod is not running yet."""

    reason: str  # one of SEVERITY
    message: str


@dataclass(frozen=True)
class Failure:
    """Why the first pod of an attempt ended; `caused_by_cluster` failures do not count as restarts."""

    cause: str  # PermanentError | OOMKilled | Evicted | Preempted | NodeLost | ExitCode | Stopped | Deleted
    pod: str
    rank: int | None
    node: str | None
    exit_code: int | None
    message: str
    finished_at: str | None
    caused_by_cluster: bool
    log_tail: str | None = None  # the kubelet's log fallback, when the trainer wrote no message

    @property
    def permanent(self) -> bool:
        return self.cause == "PermanentError"


def _no_constant(token: str) -> Any:
    raise ValueError(f"{token} is not a JSON number a status can hold")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400
        raise ValueError("a number beyond float range")
    return value


def _bounded_int(text: str) -> int:
    value = int(text)
    if abs(value) > 2**53:  # beyond what a status (JSON, int64, a float in most clients) holds exactly
        raise ValueError("an integer beyond 2**53")
    return value


def _nesting(value: Any) -> int:
    """How deep JSON containers nest in ``value`` (0: a scalar, 1: a flat object), without recursing."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_summary(message: str | None) -> dict[str, Any] | None:
    """The trainer's termination message (docs/contract.md) -> summary dict, or None if it is not a JSON
    object a status can hold: the pod wrote it, and the whole summary goes into status, so NaN, Infinity,
    1e400, an integer beyond 2**53 (which the API server would refuse in the patch, jamming the
    training's reconciliation) or containers nested deeper than SUMMARY_MAX_DEPTH make it unreadable."""
    if not message:
        return None
    try:
        value = json.loads(message, parse_constant=_no_constant, parse_float=_finite_float,
                           parse_int=_bounded_int)
    except (ValueError, RecursionError):  # JSONDecodeError, our refusals, int()'s digit limit, "[[[[..."
        return None
    return value if isinstance(value, dict) and _nesting(value) <= SUMMARY_MAX_DEPTH else None


def final_summary(pod: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """Rank 0's termination message, parsed (None: none, or not a summary), and when its trainer container
    started (running or since ended)."""
    summary = started = None
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        state = cs.get("state") or {}
        if state.get("terminated"):
            summary = parse_summary(state["terminated"].get("message"))
        started = (state.get("running") or state.get("terminated") or {}).get("startedAt") or started
    return summary, started


def _status(pod: dict[str, Any]) -> dict[str, Any]:
    return pod.get("status") or {}


def _name(pod: dict[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name") or "")


def _condition(pod: dict[str, Any], ctype: str, status: str | None = None) -> dict[str, Any] | None:
    """The pod's condition of this type (given a status: only where it has that status), or None."""
    return next((c for c in _status(pod).get("conditions") or []
                 if c.get("type") == ctype and (status is None or c.get("status") == status)), None)


def _claims(pod: dict[str, Any]) -> list[str]:
    return [v["persistentVolumeClaim"]["claimName"] for v in (pod.get("spec") or {}).get("volumes") or []
            if (v.get("persistentVolumeClaim") or {}).get("claimName")]


def _image(pod: dict[str, Any], container: str) -> str:
    containers = (pod.get("spec") or {}).get("containers") or []
    return next((str(c.get("image") or "") for c in containers if c.get("name") == container), "")


def waiting_reason(pod: dict[str, Any], events: list[dict[str, Any]] | None = None) -> Waiting | None:
    """Why this pod is not running, or None when it runs (or has finished).

    `events` are the pod's Warning Events, consulted only for mounts (they appear nowhere else).
    """
    st = _status(pod)
    if st.get("phase") not in (None, "Pending"):
        return None
    for cs in [*(st.get("initContainerStatuses") or []), *(st.get("containerStatuses") or [])]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason, detail = waiting.get("reason") or "", redact_urls(str(waiting.get("message") or ""))
        if reason in IMAGE_PULL_REASONS:
            image = str(cs.get("image") or _image(pod, cs.get("name", "")))
            text = f"image {image} cannot be pulled ({reason})"
            return Waiting("ImagePullFailed", f"{text}: {detail}" if detail else text)
        if reason in CONFIG_REASONS:
            text = f"container {cs.get('name')} cannot be created ({reason})"
            return Waiting("ContainerConfigError", f"{text}: {detail}" if detail else text)
    if scheduled := _condition(pod, "PodScheduled", "False"):
        message = str(scheduled.get("message") or scheduled.get("reason") or "not scheduled")
        claim = _CLAIM.search(message)
        if claim or "PersistentVolumeClaim" in message:
            name = claim.group(1) if claim else ", ".join(_claims(pod)) or "?"
            return Waiting("VolumeNotReady", f"volume claim {name} cannot be bound: {message}")
        return Waiting("Unschedulable", f"unschedulable: {message}")
    for ev in events or []:
        if ev.get("reason") in ("FailedMount", "FailedAttachVolume"):
            return Waiting("VolumeNotReady", f"a volume cannot be mounted: {ev.get('message')}")
    for cs in st.get("initContainerStatuses") or []:
        if cs.get("name") == DATASET_INIT and (cs.get("state") or {}).get("running"):
            return Waiting("FetchingDataset", "the dataset init container is fetching spec.dataset.url into "
                           f"its cache claim (kubectl logs {_name(pod)} -c {DATASET_INIT})")
    if _condition(pod, "PodScheduled", "True"):
        return Waiting("ContainerCreating", "containers are being created")
    return Waiting("WaitingForPods", "waiting to be scheduled")


# Why the API server refuses a pod the Job controller creates (its FailedCreate Event's message), and
# whether time can fix it: (pattern, what it is, what to do).
_REFUSALS: list[tuple[re.Pattern[str], str, str]] = [
    # Policies first: their messages quote names (a ServiceAccount) that the patterns below look for.
    (re.compile(r"peerAdmission\.creators"),
     "the chart's trainer-pod policy refuses the workload's controller",
     "add the user the message names to the chart value trainingNetworkPolicy.peerAdmission.creators"),
    (re.compile(r"ValidatingAdmissionPolicy", re.I), "a ValidatingAdmissionPolicy refuses the pod",
     "a person must satisfy or change the policy"),
    (re.compile(r"exceeded quota|status unknown for quota"), "a ResourceQuota of the namespace is exhausted",
     "the Job controller retries, and the pods start once the quota's usage drops or the quota is raised"),
    (re.compile(r"violates PodSecurity"), "the namespace's Pod Security level forbids the pod",
     "a person must change the training (for example its dataset volume) or the namespace's level"),
    (re.compile(r"service ?account", re.I),
     "spec.serviceAccountName names a ServiceAccount that does not exist",
     "a person must create it or change spec.serviceAccountName"),
    (re.compile(r"PriorityClass", re.I),
     "spec.priorityClassName names a PriorityClass that does not exist",
     "a person must create it or change spec.priorityClassName"),
    (re.compile(r"(maximum|minimum) .* usage per|LimitRange|must be less than or equal to .* limit", re.I),
     "a LimitRange of the namespace refuses the pod's resources",
     "a person must change spec.resources or the LimitRange"),
    (re.compile(r"admission webhook", re.I), "an admission webhook refuses the pod",
     "a person must satisfy or change the webhook's policy"),
]


# The Job controller's reason, and the Kubeflow training-operator's for its PyTorchJobs.
CREATE_REFUSED_REASONS = ("FailedCreate", "FailedCreatePod")


def create_refused(workload_events: list[dict[str, Any]]) -> Waiting | None:
    """Why the API server refuses the workload's pods, from its newest FailedCreate Event (the Job
    controller's; the pods never exist, so nothing else says it), or None. The message says how many
    creates were refused, what the server said, and whether waiting can fix it."""
    refused = [ev for ev in workload_events if ev.get("reason") in CREATE_REFUSED_REASONS]
    if not refused:
        return None
    # Cluster.workload_refusals has already folded an Event's series and timestamps into these two keys.
    newest = max(refused, key=lambda ev: str(ev.get("lastTimestamp") or ""))
    said = str(newest.get("message") or "").removeprefix("Error creating: ")
    count = sum(int(ev.get("count") or 1) for ev in refused)
    what, todo = next(((w, t) for pattern, w, t in _REFUSALS if pattern.search(said)),
                      ("the API server refuses the pod", "read the message: a person may need to act"))
    return Waiting("PodCreateRefused",
                   f"{count} pod create(s) refused: {what}; {todo}. The API server said: {said}")


def creating(pod: dict[str, Any]) -> bool:
    """Scheduled but its containers not started: where a mount failure keeps a pod, and the only pods
    whose Events `waiting_reason` needs."""
    return _status(pod).get("phase") == "Pending" and _condition(pod, "PodScheduled", "True") is not None


def scheduled_at(pod: dict[str, Any]) -> str | None:
    """When the pod was bound to a node (its PodScheduled condition turned True), or None."""
    scheduled = _condition(pod, "PodScheduled", "True") or {}
    return str(scheduled.get("lastTransitionTime") or "") or None


def worst_waiting(pods: list[dict[str, Any]], events: dict[str, list[dict[str, Any]]] | None = None
                  ) -> tuple[Waiting, int] | None:
    """The worst reason any pod waits for, and how many pods wait for it (None: none waits)."""
    reasons = [w for p in pods if (w := waiting_reason(p, (events or {}).get(_name(p))))]
    if not reasons:
        return None
    worst = min(reasons, key=lambda w: SEVERITY.index(w.reason))
    return worst, sum(1 for w in reasons if w.reason == worst.reason)


def running_count(pods: list[dict[str, Any]]) -> int:
    """Pods that run, or have finished well: a rank done before the others is not waiting."""
    return sum(1 for p in pods if _status(p).get("phase") in ("Running", "Succeeded"))


def _terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The state of the container that ended: an init container that failed (the dataset initializer),
    else the trainer."""
    for key, failed_only in (("initContainerStatuses", True), ("containerStatuses", False)):
        for cs in _status(pod).get(key) or []:
            term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
            if term and (term.get("exitCode") or not failed_only):
                return dict(term)
    return None


def _disruption(pod: dict[str, Any]) -> str | None:
    """Preempted, NodeLost or Evicted when the cluster ended the pod (None: the training did)."""
    if cond := _condition(pod, "DisruptionTarget", "True"):
        reason = str(cond.get("reason") or "")  # PreemptionByScheduler, DeletionByTaintManager, ...
    elif _status(pod).get("reason") in DISRUPTION_REASONS:
        reason = str(_status(pod)["reason"])
    else:
        return None
    if "Preempt" in reason:
        return "Preempted"
    if "Taint" in reason or "GC" in reason or reason == "NodeLost":
        return "NodeLost"
    return "Evicted"


def _failed(pod: dict[str, Any]) -> bool:
    if _status(pod).get("phase") == "Failed":
        return True
    term = _terminated(pod)
    return bool(term and term.get("exitCode"))


def first_failure(pods: list[dict[str, Any]], rank_of: Callable[[dict[str, Any]], int | None]
                  ) -> Failure | None:
    """The pod whose failure ended the attempt (the earliest to end), classified.

    Pods that ended after it with a plain non-zero exit lost their peer; the first one is the cause.
    `rank_of(pod)` gives a pod's machine rank (backend-specific labels). The trainer's own one-line
    reason comes from that pod's termination message, when it wrote one.
    """
    failed = [p for p in pods if _failed(p)]
    if not failed:
        return None

    def finished(p: dict[str, Any]) -> str:
        return str((_terminated(p) or {}).get("finishedAt") or "9999")

    # A disruption explains its peers' failures, whatever the order they were reported in.
    disrupted = [p for p in failed if _disruption(p)]
    pod = min(disrupted or failed, key=finished)
    term = _terminated(pod) or {}
    # The message (a summary, or the log tail of a container that crashed before it could redact it)
    # shows no URL's userinfo or query string.
    if isinstance(term.get("message"), str):
        term["message"] = redact_urls(term["message"])
    code = term.get("exitCode")
    summary = parse_summary(term.get("message"))
    trainer_error = (summary or {}).get("error")
    # terminationMessagePolicy FallbackToLogsOnError: a container that wrote no message gets its
    # last log lines as the message, so a crash's log tail needs no access to pod logs.
    log_tail = None if summary is not None or not term.get("message") else \
        "\n".join(str(term["message"]).rstrip("\n").splitlines()[-LOG_TAIL_LINES:])
    node = (pod.get("spec") or {}).get("nodeName")
    if disruption := _disruption(pod):
        cause, by_cluster = disruption, True
        target = _condition(pod, "DisruptionTarget") or {}
        message = str(_status(pod).get("message") or target.get("message") or disruption)
    elif term.get("reason") == "OOMKilled":
        cause, by_cluster, message = "OOMKilled", False, "the container ran out of memory (OOMKilled)"
    elif code == exits.PERMANENT:
        cause, by_cluster = "PermanentError", False
        message = trainer_error or "the trainer reported an error that a restart cannot fix"
    elif code == exits.STOPPED:  # not the training's failure, so it does not count either
        cause, by_cluster = "Stopped", True
        message = trainer_error or "stopped on SIGTERM after saving a step checkpoint"
    else:
        cause, by_cluster = "ExitCode", False
        message = trainer_error or f"exited with code {code}"
    return Failure(cause=cause, pod=_name(pod), rank=rank_of(pod), node=node,
                   exit_code=code if isinstance(code, int) else None, message=message,
                   finished_at=term.get("finishedAt"), caused_by_cluster=by_cluster, log_tail=log_tail)


def all_ranks_succeeded(pods: list[dict[str, Any]], replicas: int,
                        rank_of: Callable[[dict[str, Any]], int | None]) -> str | None:
    """When every rank 0..replicas-1 has a pod that Succeeded: the last one's finishedAt ("" if none is
    recorded). None while a rank has not. The workload's controller says the same later, once it has
    counted them (at 1000 trainings the Job controller took up to 48 s: docs/scale.md)."""
    if any(_failed(p) for p in pods):
        return None  # the workload's failure policy decides what a failed pod means
    done = {rank_of(p): str((_terminated(p) or {}).get("finishedAt") or "")
            for p in pods if _status(p).get("phase") == "Succeeded"}
    if any(rank not in done for rank in range(replicas)):
        return None
    return max(done[rank] for rank in range(replicas))


def terminating_unfinished(pod: dict[str, Any]) -> bool:
    """Being deleted, on a node, and not finished: only the node's kubelet can end such a pod. If that
    node is lost (`lost_on`), nothing ever will."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp")) and bool(node_of(pod)) \
        and _status(pod).get("phase") not in ("Succeeded", "Failed")


def node_of(pod: dict[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def node_lost(node: dict[str, Any] | None) -> str | None:
    """Why a node is lost, or None: it no longer exists, or the node controller set its Ready condition
    to Unknown (no kubelet has reported for node-monitor-grace-period). Ready False is a kubelet that
    reports: not lost."""
    if node is None:
        return "its Node object was deleted"
    conditions = (node.get("status") or {}).get("conditions") or []
    ready: dict[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
    return "Ready Unknown" if ready.get("status") == "Unknown" else None


def vanished_failure(pods: list[dict[str, Any]], replicas: int,
                     rank_of: Callable[[dict[str, Any]], int | None]) -> Failure | None:
    """A failed attempt that shows no failed pod, and a rank with no pod at all: that rank's pod was
    deleted (by a person or a controller) before its end could be read, which is the cluster's doing,
    not the training's. A Job keeps the pods that failed, so a failure of the training leaves one."""
    present = {rank_of(p) for p in pods}
    missing = [rank for rank in range(replicas) if rank not in present]
    if not missing:
        return None
    return Failure(cause="Deleted", pod="", rank=missing[0], node=None, exit_code=None,
                   message=f"the pod of rank {missing[0]} was deleted before its end could be read",
                   finished_at=None, caused_by_cluster=True)


def lost_node_failure(pod: dict[str, Any], why: str, rank_of: Callable[[dict[str, Any]], int | None]
                      ) -> Failure:
    """A pod of the attempt stuck on a lost node (`why`: `node_lost`'s words): the cluster failed it."""
    node, name = node_of(pod), _name(pod)
    rank = rank_of(pod)
    ranked = f"its pod {name}" + (f" (rank {rank})" if rank is not None else "")
    return Failure(cause="NodeLost", pod=name, rank=rank, node=node, exit_code=None,
                   message=f"node {node} stopped responding ({why}); {ranked} was force-deleted",
                   finished_at=None, caused_by_cluster=True)
