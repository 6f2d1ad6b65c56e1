"""The children every attempt of a training shares: the headless Service (ours, or nothing is done until
it is), the NetworkPolicy, and the output claim (one left by an earlier training of this name goes first)."""

from __future__ import annotations

from typing import Any

from pets_operator import builders, children
from pets_operator.plan_types import Plan, Round


def service_conflict(r: Round) -> str | None:
    """Why nothing can be done while the Service of our name is another's (None: it is ours, or there is
    none yet)."""
    if (service := r.observed.foreign_service) is None:
        return None
    return (f"Service {r.target.namespace}/{service['metadata']['name']} exists and is not owned by this "
            "PetsTraining; delete or rename it")


def service_and_network_policy(r: Round, plan: Plan) -> dict[str, Any] | None:
    """The headless Service (where the backend has one) and the NetworkPolicy, which every attempt
    shares; the policy is returned for the first workload to be made after it.

    The training's NetworkPolicy, if it is to have one, is made once, with the first workload and before
    it (plan's creating branch), and then named in status.children; a training that an operator without
    policies started (its status names children, but no policy) gets it in this round. The one the
    operator made is deleted when spec.networkPolicy or the chart's switch turns it off. No watch is
    needed: the policy is owned by the training, and a create of an existing one is a no-op."""
    service = r.observed.backend.build_service(r.spec, r.target)
    if service is not None and r.observed.service is None:
        plan.create.append(service)
    policy, made = children.build_network_policy(r.spec, r.target), made_network_policy(r)
    named = plan.status.children
    assert named is not None  # the planner names this attempt's children first
    if policy is not None:
        if not made and r.old.children:  # started without (a made one is already named: carried over)
            plan.create.append(policy)
            named["networkPolicy"] = policy["metadata"]["name"]
    elif made:
        plan.delete.append({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "name": made,
                            "namespace": r.target.namespace})
        named.pop("networkPolicy", None)
    return policy


def made_network_policy(r: Round) -> str | None:
    """The NetworkPolicy the operator made for this training in an earlier round (None: none)."""
    return (r.old.children or {}).get("networkPolicy")


def claim_of_another(r: Round) -> str | None:
    """Why the workload waits: the output claim exists and goes (being deleted, or owned by a training
    that is no more), and pods made now would mount a claim about to go, and wait for ever (None: it
    does not). A claim with no owner (Retain) is kept work: it is used as it is."""
    claim = r.observed.output_claim
    if claim is None:
        return None
    meta = claim.get("metadata") or {}
    owners = [o.get("uid") for o in meta.get("ownerReferences") or []]
    if not meta.get("deletionTimestamp") and (not owners or r.meta.get("uid") in owners):
        return None
    return (f"waiting for the claim {builders.output_claim_name(r.target.name)} of an earlier "
            "PetsTraining of this name to be deleted")
