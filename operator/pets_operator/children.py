"""The children of a training besides its pods: the claims the operator makes (the output's, the
dataset's cache), the output where spec.output is unset, the headless Service, the NetworkPolicy and the
Indexed Job around the pod template (`builders`)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pets_contract import exits
from pets_operator import api, builders, pods
from pets_operator.spec import Spec
from pets_operator.status_types import Status

# status.outputReason: why the operator chose the output of a training without spec.output.
OPERATOR_DEFAULT = "OperatorDefault"  # `pets-operator run --default-output` (the chart's defaultOutput)


NO_DEFAULT_STORAGE_CLASS = "NoDefaultStorageClass"  # a default claim could not be made: an emptyDir


OUTPUT_REASONS = (OPERATOR_DEFAULT, NO_DEFAULT_STORAGE_CLASS)


def keep_or_choose_output(old_status: Status, default: dict[str, Any],
                          has_default_class: Callable[[], bool | None]) -> tuple[dict[str, Any], str]:
    """The output where spec.output is unset, and why (OUTPUT_REASONS): the operator's default, chosen
    once and then kept in status.output, so a changed default never moves a training's work. A default
    claim with no StorageClass named falls back to an emptyDir where the cluster has no default
    StorageClass (`has_default_class` says False; None: not allowed to look): the claim would wait for
    ever, and the training with it."""
    if isinstance(old_status.output, dict):
        return old_status.output, str(old_status.output_reason or OPERATOR_DEFAULT)
    if "managedClaim" in default and not default["managedClaim"].get("storageClassName") \
            and has_default_class() is False:
        return {"emptyDir": {}}, NO_DEFAULT_STORAGE_CLASS
    return default, OPERATOR_DEFAULT


def binding_modes(classes: Iterable[Mapping[str, Any]]) -> tuple[dict[str, str], str | None]:
    """Each StorageClass's volumeBindingMode (the API server's default: Immediate) by name, and the
    cluster's default class (None: none)."""
    modes, default = {}, None
    for sc in classes:
        meta = sc.get("metadata") or {}
        modes[meta["name"]] = sc.get("volumeBindingMode") or "Immediate"
        if (meta.get("annotations") or {}).get(api.DEFAULT_STORAGE_CLASS_ANNOTATION) == "true":
            default = meta["name"]
    return modes, default


def bound(claim: Mapping[str, Any] | None) -> bool:
    """Whether a claim the operator makes is bound (None: not made yet)."""
    return claim is not None and (claim.get("status") or {}).get("phase") == "Bound"


def build_dataset_cache_claim(spec: Spec, target: builders.Target) -> dict[str, Any] | None:
    """The PersistentVolumeClaim spec.dataset.url is fetched into, or None for another source. Not owned
    by the training (children.owned): the next training on the same data finds it full."""
    if spec.dataset_source != "url":
        return None
    return _claim({"name": builders.dataset_cache_name(spec), "namespace": target.namespace,
                   "labels": {"app.kubernetes.io/name": "pets-training", api.LABEL_COMPONENT: "dataset-cache",
                              api.LABEL_DATASET_CACHE: "true"},
                   "annotations": {api.ANNOTATION_DATASET_URL: spec.dataset["url"]}},
                  builders.gang_access_modes(spec), spec.dataset.get("cache") or {},
                  api.DEFAULT_DATASET_CACHE_SIZE)


def _claim(metadata: dict[str, Any], access_modes: list[str], wanted: Mapping[str, Any],
           default_size: str) -> dict[str, Any]:
    """A PersistentVolumeClaim of the size and StorageClass `wanted` asks (unset: the default size, the
    cluster's default class)."""
    spec: dict[str, Any] = {"accessModes": access_modes,
                            "resources": {"requests": {"storage": str(wanted.get("size") or default_size)}}}
    if wanted.get("storageClassName"):
        spec["storageClassName"] = wanted["storageClassName"]
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": spec}


def build_output_claim(spec: Spec, target: builders.Target) -> dict[str, Any] | None:
    """The PersistentVolumeClaim of spec.output.managedClaim, or None for another output. With
    retentionPolicy Retain it carries the output-retention label, and the operator gives it no owner
    reference, so deleting the training leaves it."""
    claim = api.output_of(spec).get("managedClaim")
    if claim is None:
        return None
    metadata = builders.metadata(target, builders.output_claim_name(target.name), "output")
    metadata["labels"][api.LABEL_OUTPUT_RETENTION] = claim.get("retentionPolicy") or "Delete"
    access_modes = list(claim.get("accessModes") or builders.gang_access_modes(spec))  # unset: the gang's
    return _claim(metadata, access_modes, claim, api.DEFAULT_OUTPUT_CLAIM_SIZE)


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether `obj` is controlled by the object of `uid` (its owner reference)."""
    return any(ref.get("uid") == uid and ref.get("controller")
               for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


def owned(manifest: dict[str, Any]) -> bool:
    """Whether a child goes with its training (an owner reference): all but a Retain output claim and a
    dataset cache (shared by the trainings on the same data)."""
    found = manifest["metadata"].get("labels") or {}
    return found.get(api.LABEL_OUTPUT_RETENTION) != "Retain" and api.LABEL_DATASET_CACHE not in found


def build_service(spec: Spec, target: builders.Target) -> dict[str, Any]:
    """Headless Service giving every pod the stable name `<job>-<index>.<service>`."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": builders.metadata(target, builders.service_name(target.name), "rendezvous"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": builders.selector(target.name),
            "ports": [
                {"name": "rendezvous", "port": spec.master_port, "targetPort": spec.master_port,
                 "protocol": "TCP"},
                {"name": "metrics", "port": api.METRICS_PORT, "targetPort": api.METRICS_PORT,
                 "protocol": "TCP"},
            ],
        },
    }


def build_network_policy(spec: Spec, target: builders.Target) -> dict[str, Any] | None:
    """The training's pods accept connections from the pods of the same training on every port (the
    rendezvous, and gloo's and NCCL's collectives, which listen on ports of their own choosing), and on
    the progress port from the operator's peers; nothing else. torch.distributed's rendezvous has no
    authentication (PyTorch's SECURITY.md), so no other pod may reach it. One policy per training, not
    per attempt: two attempts never run at once (the next waits for the previous one's pods to go), so
    the training's label covers the attempt. Egress is left open: data and weights come from anywhere."""
    if not (spec.network_policy and target.network_policy.enabled):
        return None
    trainers = {"podSelector": {"matchLabels": builders.selector(target.name)}}
    progress: dict[str, Any] = {"ports": [{"protocol": "TCP", "port": api.METRICS_PORT}]}
    if target.network_policy.metrics_from:
        progress["from"] = [copy.deepcopy(dict(peer)) for peer in target.network_policy.metrics_from]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": builders.metadata(target, target.name, "network-policy"),
        "spec": {
            **trainers,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [trainers]}, progress],
        },
    }


KUEUE_MIN_PARALLELISM = "kueue.x-k8s.io/job-min-parallelism"
KUEUE_COMPLETIONS_EQUAL_PARALLELISM = "kueue.x-k8s.io/job-completions-equal-parallelism"


def build_job(spec: Spec, target: builders.Target) -> dict[str, Any]:
    """Indexed Job: one pod per machine, rank = completion index, all-or-nothing (backoffLimit 0)."""
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": builders.workload_metadata(spec, target),
        "spec": {
            "completionMode": "Indexed",
            "completions": spec.replicas,
            "parallelism": spec.replicas,
            # One failed pod fails the Job; the operator restarts the whole gang (spec.maxRestarts)...
            "backoffLimit": 0,
            # ...unless the trainer says a restart cannot help (docs/contract.md): then the Job fails
            # with reason PodFailurePolicy and the operator fails the training at once. A pod the
            # cluster disrupted (evicted, preempted, node lost) fails the Job too, but by the second
            # rule, which the Job's condition names: the evicted pod may be gone before the operator
            # looks, and the Job keeps the cause (a restart not counted against maxRestarts).
            "podFailurePolicy": {"rules": [
                {"action": "FailJob",
                 "onExitCodes": {"containerName": builders.CONTAINER, "operator": "In",
                                 "values": [exits.PERMANENT]}},
                *([{"action": "FailJob",
                    "onExitCodes": {"containerName": pods.DATASET_INIT, "operator": "In",
                                    "values": [exits.PERMANENT]}}]
                  if spec.dataset_source == "url" else []),
                {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            ]},
            "suspend": builders.created_suspended(spec, target),
            "template": builders.pod_template(spec, target),
        },
    }
    if (deadline := builders.attempt_deadline(spec, target)) is not None:
        job["spec"]["activeDeadlineSeconds"] = deadline
    least = int((spec.elastic or {}).get("minReplicas") or spec.replicas)
    if target.queued and least < spec.replicas:
        # Kueue's partial admission: it may admit as few as `least` pods, setting parallelism and
        # completions alike (so the indexes, our ranks, stay 0..n-1); the operator then rebuilds the
        # workload at the admitted size, since its pods were built for spec.replicas (resize.py).
        job["metadata"]["annotations"] |= {KUEUE_MIN_PARALLELISM: str(least),
                                           KUEUE_COMPLETIONS_EQUAL_PARALLELISM: "true"}
    return job

