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

from pets_operator import api, builders, children, deadlines
from pets_operator.plan_types import Plan, Round, Verdict
from pets_operator.timestamps import parse_timestamp

# Claims are not watched: a waiting training looks again after a second, then less often the longer it
# waits (a tenth of the wait, at most every 30 s), so a claim that never binds costs the API server little.
CLAIM_POLL_SECONDS, CLAIM_POLL_MAX_SECONDS = 1.0, 30.0


def waiting(r: Round, plan: Plan) -> Verdict | None:
    """The pods are not made yet: they would wait for a claim the operator made that is not bound, on a
    class that binds Immediate (a workload made suspended waits for nothing). Bounded by
    spec.scheduling.pendingTimeoutSeconds; looked at again less often the longer it waits."""
    unbound = _unbound(r)
    if not unbound or builders.created_suspended(r.spec, r.target):
        return None
    message = _waiting_message(unbound)
    if (timed_out := deadlines.pending_timed_out(r, plan)) is not None:
        plan.create.clear()  # what it would have made first is there: the claims made it wait
        return api.FAILED, "PendingTimeout", f"{timed_out}: {message}"
    poll = _poll_after((r.now - parse_timestamp(str(plan.status.pending_since))).total_seconds())
    plan.requeue_after = poll if plan.requeue_after is None else min(plan.requeue_after, poll)
    return (api.RESTARTING if r.restarts else api.PENDING), "WaitingForClaimBinding", message


def _unbound(r: Round) -> dict[str, str]:
    wanted = [c for c in (children.build_output_claim(r.spec, r.target),
                          children.build_dataset_cache_claim(r.spec, r.target)) if c is not None]
    return _unbound_immediate(wanted, r.observed.claims, r.observed.storage_classes)


def _poll_after(waited: float) -> float:
    """Seconds until a training that has waited `waited` seconds for its claims looks again."""
    return min(CLAIM_POLL_MAX_SECONDS, max(CLAIM_POLL_SECONDS, waited / 10))


def _unbound_immediate(wanted: Iterable[Mapping[str, Any]], found: Mapping[str, Mapping[str, Any] | None],
                       classes: Iterable[Mapping[str, Any]] | None) -> dict[str, str]:
    """The claims of `wanted` (the manifests the operator makes) that the pods wait for, by name, with
    their StorageClass: not Bound (`found`: each as read, None where not made yet) on a class that binds
    at once. `classes` None: the operator may not list StorageClasses, so none waits."""
    if classes is None:
        return {}
    modes, default = children.binding_modes(classes)
    unbound = {}
    for manifest in wanted:
        name = manifest["metadata"]["name"]
        claim = found.get(name)
        if children.bound(claim):
            continue
        # A made claim has its class from the API server (DefaultStorageClass); "" asks for none.
        named = (claim or manifest)["spec"].get("storageClassName")
        storage_class = default if named is None else named
        if storage_class and modes.get(storage_class) == "Immediate":
            unbound[name] = storage_class
    return unbound


def _waiting_message(claims: Mapping[str, str]) -> str:
    listed = ", ".join(f"{name} (StorageClass {cls})" for name, cls in sorted(claims.items()))
    return (f"waiting for the claim{'s' if len(claims) > 1 else ''} {listed} to be bound before making the "
            f"pods (the class binds Immediate): `kubectl describe pvc` says why it is not")
