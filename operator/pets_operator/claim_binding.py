"""The pods are made only once the claims the operator made for them are bound, where their StorageClass
binds at once (volumeBindingMode Immediate).

kube-scheduler turns away a pod whose Immediate claim is not bound yet ("pod has unbound immediate
PersistentVolumeClaims") and is meant to try it again when the claim binds; at 1.33 it once missed that
and tried again only at its flush of unschedulable pods, 5 minutes later: the Quick start's pods waited
5 min 22 s for a claim bound 2 s after they were made. Under WaitForFirstConsumer the scheduler itself
asks for the volume, so nothing waits, and nothing waits where the operator may not list StorageClasses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pets_operator import api

# Claims are not watched: a waiting training looks again after a second, then less often the longer it
# waits (a tenth of the wait, at most every 30 s), so a claim that never binds costs the API server little.
CLAIM_POLL_SECONDS, CLAIM_POLL_MAX_SECONDS = 1.0, 30.0


def poll_after(waited: float) -> float:
    """Seconds until a training that has waited `waited` seconds for its claims looks again."""
    return min(CLAIM_POLL_MAX_SECONDS, max(CLAIM_POLL_SECONDS, waited / 10))


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


def pending(claim: Mapping[str, Any] | None) -> bool:
    """Whether a claim the operator makes is still to be bound (None: not made yet)."""
    return claim is None or (claim.get("status") or {}).get("phase") != "Bound"


def unbound_immediate(wanted: Iterable[Mapping[str, Any]], found: Mapping[str, Mapping[str, Any] | None],
                      classes: Iterable[Mapping[str, Any]] | None) -> dict[str, str]:
    """The claims of `wanted` (the manifests the operator makes) that the pods wait for, by name, with
    their StorageClass: not Bound (`found`: each as read, None where not made yet) on a class that binds
    at once. `classes` None: the operator may not list StorageClasses, so none waits."""
    if classes is None:
        return {}
    modes, default = binding_modes(classes)
    waiting = {}
    for manifest in wanted:
        name = manifest["metadata"]["name"]
        claim = found.get(name)
        if not pending(claim):
            continue
        # A made claim has its class from the API server (DefaultStorageClass); "" asks for none.
        named = (claim or manifest)["spec"].get("storageClassName")
        storage_class = default if named is None else named
        if storage_class and modes.get(storage_class) == "Immediate":
            waiting[name] = storage_class
    return waiting


def waiting_message(claims: Mapping[str, str]) -> str:
    listed = ", ".join(f"{name} (StorageClass {cls})" for name, cls in sorted(claims.items()))
    return (f"waiting for the claim{'s' if len(claims) > 1 else ''} {listed} to be bound before making the "
            f"pods (the class binds Immediate): `kubectl describe pvc` says why it is not")
