"""The Kubernetes permissions the operator uses, in one place.

The chart's Role/ClusterRole must grant at least these (tests/integration checks it with
SelfSubjectAccessReviews under the chart's ServiceAccount); docs/operator.md explains each one.
"""

from __future__ import annotations

from pets_operator import api

# (API group, resource, verbs) in every watched namespace.
NAMESPACED: list[tuple[str, str, tuple[str, ...]]] = [
    (api.GROUP, api.PLURAL, ("get", "list", "watch", "patch", "update", "delete")),
    (api.GROUP, f"{api.PLURAL}/status", ("get", "patch", "update")),
    (api.GROUP, f"{api.PLURAL}/finalizers", ("update",)),
    ("batch", "jobs", ("create", "get", "list", "watch", "patch", "delete")),
    # The headless Service is created once and deleted with its training: never patched.
    ("", "services", ("create", "get", "list", "watch", "delete")),
    # The NetworkPolicy around a training's pods: created once (before its first pods), deleted only when
    # spec.networkPolicy or the chart's trainingNetworkPolicy.enabled turns it off; never read.
    ("networking.k8s.io", "networkpolicies", ("create", "delete")),
    # delete: only pods of our trainings, and only those stuck on a node the node controller marked
    # lost (Ready Unknown, or the Node gone), force-deleted (docs/operator.md, "Nodes lost...").
    ("", "pods", ("get", "list", "watch", "delete")),
    # The output claim (spec.output.managedClaim, or the default output): created once, before the first
    # workload; read (get) while the training waits, to say in status whether its claim is Pending. It
    # goes with the training through its owner reference: deleted by the garbage collector, never by the
    # operator.
    ("", "persistentvolumeclaims", ("create", "get")),
    # Events are written on the training, and read for pods that wait on a volume mount (FailedMount
    # is reported nowhere else).
    ("", "events", ("create", "patch", "list")),
    ("events.k8s.io", "events", ("create", "patch")),
    ("kubeflow.org", "pytorchjobs", ("create", "get", "list", "watch", "patch", "delete")),
    # Kueue's Workload of a queued training: read for its admission and reasons, patched (spec.active)
    # when the user suspends or resumes it.
    ("kueue.x-k8s.io", "workloads", ("list", "patch")),
]

# (API group, resource, verbs) cluster-wide, in both of the chart's modes (namespaced mode: a ClusterRole
# with these alone).
CLUSTER: list[tuple[str, str, tuple[str, ...]]] = [
    # Read only to tell whether the node of a pod stuck terminating is lost (the chart's rbac.nodes).
    ("", "nodes", ("get",)),
    # Read once per training that has no spec.output, to fall back to an emptyDir (and say so) when the
    # cluster has no default StorageClass; where it is not granted (the chart's rbac.storageClasses) the
    # operator assumes a default exists.
    ("storage.k8s.io", "storageclasses", ("list",)),
]
