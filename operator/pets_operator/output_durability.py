"""The OutputDurable condition: where a training's checkpoints and results are kept, and what to do
when that place does not outlive the pods."""

from __future__ import annotations

from pets_operator import api, builders
from pets_operator.children import NO_DEFAULT_STORAGE_CLASS
from pets_operator.plan_types import Plan, Round, set_condition

_EMPTYDIR_FIX = ("set spec.output.managedClaim.storageClassName (the operator makes a claim of that "
                 "class), spec.output.persistentVolumeClaim, or give the cluster a default StorageClass")


def output_durable(r: Round, plan: Plan) -> None:
    """OutputDurable: whether the work outlives the pods (a restart resumes, `fetch` has files), and how
    to get there when it does not. Unknown while the claim is Pending and a pod waits for it."""
    spec, observed, name = r.spec, r.observed, r.target.name
    output = api.output_of(spec)
    claim = observed.output_claim
    durable: bool | None
    if claim is not None and (claim.get("status") or {}).get("phase") == "Pending":
        claim_name = claim["metadata"]["name"]
        durable, reason = None, "ClaimPending"
        modes = claim["spec"].get("accessModes") or []
        message = (f"the claim {claim_name} (StorageClass {claim['spec'].get('storageClassName') or 'none'}"
                   f", {', '.join(modes)}) is Pending and the pods wait for it to bind: `kubectl describe "
                   f"pvc {claim_name}` says why")
        if "ReadWriteMany" in modes:
            message += (" (a class without ReadWriteMany never binds it: name one that has it in "
                        "spec.output.managedClaim.storageClassName, or keep the pods on one node with "
                        "accessModes [ReadWriteOnce])")
    elif "managedClaim" in output:
        retention = output["managedClaim"].get("retentionPolicy") or "Delete"
        durable, reason = True, "ManagedClaim"
        message = (f"checkpoints and results are on the claim {builders.output_claim_name(name)}, which the "
                   f"operator made (retentionPolicy {retention})")
        if observed.output_reason:
            message = "spec.output is unset, so " + message
    elif "persistentVolumeClaim" in output:
        durable, reason = True, "Claim"
        message = f"checkpoints and results are on the claim {output['persistentVolumeClaim']['claimName']}"
    elif observed.output_reason == NO_DEFAULT_STORAGE_CLASS:
        durable, reason = False, NO_DEFAULT_STORAGE_CLASS
        message = ("spec.output is unset and the cluster has no default StorageClass, so the operator made "
                   "no claim and fell back to an emptyDir, which goes with the pods: a restart or an "
                   f"eviction starts from epoch 0 and `kubectl pets fetch` finds nothing; {_EMPTYDIR_FIX}")
    else:
        durable, reason = False, "EmptyDir"
        where = ("spec.output is unset and the operator's default output is an emptyDir (the chart's "
                 "defaultOutput.managedClaim.enabled=false)" if observed.output_reason
                 else "spec.output is an emptyDir")
        message = (f"{where}, which goes with the pods: a restart or an eviction starts from epoch 0 and "
                   "`kubectl pets fetch` finds nothing; set spec.output.managedClaim: {} (the operator makes "
                   "a claim) or spec.output.persistentVolumeClaim")
    set_condition(plan.status, "OutputDurable", durable, reason, message, r.now, r.generation)
