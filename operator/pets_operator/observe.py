"""Observing one training: what the operator keeps of each watched object, rank 0's progress and summary,
and the few reads a round makes only when the watched objects say they are needed (a pod's Events, a
Node)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pets_operator import api, backends, pods, timestamps
from pets_operator.cluster import Cluster
from pets_operator.scraper import Scraper

Key = tuple[str, str]  # (namespace, name) of a PetsTraining


def rv(obj: dict[str, Any]) -> int:
    """resourceVersion as a number: etcd's revision, which grows with every write (0 if not a number)."""
    rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(rv) if rv.isdigit() else 0


def newest(objs: list[dict[str, Any]]) -> dict[str, Any] | None:
    return max(objs, key=rv, default=None)


def kept(body: Mapping[str, Any]) -> dict[str, Any]:
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


def labels_match(labels: Mapping[str, str], selector: str) -> bool:
    """An equality-based label selector ("a=b,c=d", what backends.pods_selector gives) against labels."""
    wanted = (term.split("=", 1) for term in selector.split(",") if term)
    return all(labels.get(k.strip()) == v.strip() for k, v in wanted)


def newest_rank0(backend: backends.Backend, pod_list: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Rank 0's pod (after a replacement the old one may linger: the newest wins)."""
    rank0 = [p for p in pod_list if backend.rank_of(p) == 0]
    return max(rank0, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""), default=None)


@dataclass(frozen=True)
class Rank0:
    """What rank 0's pod tells: live gauges, the final summary, and why the gauges could not be read (each
    field is Observed's of that name)."""

    progress: dict[str, float] | None = None
    summary: dict[str, Any] | None = None
    progress_error: str | None = None
    rank0_running_since: str | None = None  # when its trainer container started (running or since ended)
    progress_failing_since: datetime | None = None  # since when its reads fail (scraper.Reading)
    progress_read_at: datetime | None = None  # when the gauges were read
    progress_unreachable: bool = False  # the reads fail because rank 0 cannot be reached


def observe_rank0(pod: dict[str, Any] | None, phase_hint: str, scraper: Scraper | None, key: Key) -> Rank0:
    """Rank 0's live gauges (the scraper's last reading of this pod, while it runs) and its termination
    message (once finished)."""
    if pod is None:
        return Rank0()
    summary, started = pods.final_summary(pod)
    st = pod.get("status") or {}
    if not st.get("podIP") or st.get("phase") != "Running" or phase_hint in api.FINISHED_PHASES:
        return Rank0(summary=summary, rank0_running_since=started)
    reading = scraper.reading(key, str(pod["metadata"].get("uid") or "")) if scraper is not None else None
    if reading is None:
        return Rank0(None, summary, None, started)
    return Rank0(reading.progress, summary, reading.error, started, reading.failing_since, reading.at,
                 reading.unreachable)


CREATING_LONG = 5.0  # seconds a pod may take to start its containers before its Events are read


def pods_missing_long(workload: dict[str, Any], pod_list: list[dict[str, Any]], replicas: int,
                       backend: backends.Backend, now: datetime) -> bool:
    """Fewer pods than ranks, CREATING_LONG seconds after the (unsuspended) workload was made: only then
    are its Events read, for pods the API server refused to create."""
    if len(pod_list) >= replicas or backend.is_suspended(workload):
        return False
    made = workload["metadata"].get("creationTimestamp")
    return made is not None and (now - timestamps.parse_timestamp(made)).total_seconds() >= CREATING_LONG


def creating_long(pod: dict[str, Any], now: datetime) -> bool:
    """Scheduled, containers not started, for CREATING_LONG seconds: only then are its Warning Events
    read (a mount that fails; a list of the namespace's Events, the costliest read of a round)."""
    since = pods.scheduled_at(pod)
    return pods.creating(pod) and since is not None and \
        (now - timestamps.parse_timestamp(since)).total_seconds() >= CREATING_LONG


def lost_candidates(pod_list: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods that may sit on a lost node: being deleted and not finished (of the current workload, and
    of older ones being deleted). Only these make a round read their Node."""
    return [p for p in pod_list if pods.terminating_unfinished(p)]


def lost_pods(cl: Cluster, candidates: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Of these pods (being deleted, not finished), those on a lost node, and why each such node is
    lost. Only pods being deleted are asked about, so a healthy round reads no Node."""
    nodes = dict.fromkeys(pods.node_of(pod) for pod in candidates)  # each once, in order
    why = {node: reason for node in nodes if (reason := cl.node_lost(node))}
    return [pod for pod in candidates if pods.node_of(pod) in why], why
