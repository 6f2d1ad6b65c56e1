"""The Kubernetes adapter: blocking API calls for one PetsTraining, run in a worker thread.

It decides nothing: `reconcile.reconcile_once` asks it what is there, `plan.plan` decides, and it
carries the Plan out. Workloads are reached through their backend's API coordinates, so a new
backend needs no change here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Iterator
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from pets_operator import api, backends, children, metrics, pods

log = logging.getLogger(__name__)
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"


def api_message(exc: ApiException) -> str:
    """The API server's own message from an error response."""
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.body or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.body or exc.reason)


# A 403 on create that is no verdict on the object: a ResourceQuota (full, or its usage not computed
# yet), the operator's own RBAC, or the namespace going away. Each can change without a new spec.
_FORBIDDEN_FOR_NOW = re.compile(r"exceeded quota|status unknown for quota|cannot create resource|"
                                r"is being terminated")


@contextlib.contextmanager
def unless(*statuses: int) -> Iterator[None]:
    """An API call whose answer with one of these statuses is fine (404: gone already; 409: replaced)."""
    try:
        yield
    except ApiException as exc:
        if exc.status not in statuses:
            raise


def child_refusal_permanent(exc: ApiException) -> bool:
    """Whether the API server's refusal to create a child is final for this spec (docs/operator.md).

    Permanent: 400 and 422 (the object is invalid, or a ValidatingAdmissionPolicy refused it), 413, and a
    403 from admission (a webhook or policy denial, a LimitRange). Not permanent, retried: a 403 from a
    ResourceQuota, from RBAC or from a terminating namespace, 409, 429, 5xx, and no response at all.
    """
    if exc.status in (400, 413, 422):
        return True
    if exc.status == 403:
        return _FORBIDDEN_FOR_NOW.search(api_message(exc)) is None
    return False


def served_backends(api_client: client.ApiClient) -> set[str]:
    """Names of the backends whose API the cluster serves now (API discovery)."""
    custom = client.CustomObjectsApi(api_client)
    served = set()
    for backend in backends.BACKENDS.values():
        if backend.always_served:
            served.add(backend.name)
            continue
        with unless(404):  # 404: the backend's API group is not served
            if any(r.name == backend.plural for r in custom.get_api_resources(backend.group,
                                                                              backend.version).resources):
                served.add(backend.name)
    return served


def storage_classes(api_client: client.ApiClient) -> list[dict[str, Any]] | None:
    """The cluster's StorageClasses; None where the operator may not list them (403: the chart's
    rbac.storageClasses off)."""
    try:
        classes = client.StorageV1Api(api_client).list_storage_class()
    except ApiException as exc:
        if exc.status != 403:
            raise
        log.warning(f"cannot list StorageClasses (HTTP 403: {api_message(exc)}), so cannot tell whether "
                    "the cluster has a default one nor how each binds; taking it that it has one and that "
                    "its claims bind when the pods come")
        return None
    return [cast(dict[str, Any], api_client.sanitize_for_serialization(sc)) for sc in classes.items]


def has_default_storage_class(api_client: client.ApiClient) -> bool | None:
    """Whether a StorageClass carries the default-class annotation; None where the operator may not
    list StorageClasses, so it cannot tell."""
    classes = storage_classes(api_client)
    return None if classes is None else children.binding_modes(classes)[1] is not None


class Cluster:
    """Blocking Kubernetes calls for one PetsTraining."""

    def __init__(self, api_client: client.ApiClient, namespace: str, name: str):
        self.api_client, self.namespace, self.name = api_client, namespace, name
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.key = (namespace, name)
        self.selector = f"{api.LABEL_TRAINING}={name}"
        self._nodes: dict[str, str | None] = {}  # node -> why it is lost (None: not lost), this round

    def _dict(self, obj: Any) -> dict[str, Any]:
        return self.api_client.sanitize_for_serialization(obj)  # type: ignore[no-any-return]

    def workloads(self, backend: backends.Backend) -> list[dict[str, Any]]:
        out = cast(dict[str, Any], self.custom.list_namespaced_custom_object(
            backend.group, backend.version, self.namespace, backend.plural, label_selector=self.selector))
        return [i | {"apiVersion": backend.api_version, "kind": backend.kind} for i in out.get("items", [])]

    def node_lost(self, name: str) -> str | None:
        """Why the node is lost (`pods.node_lost`), or None; read once per round (a Cluster lives one
        round). Without the right to read Nodes (403) nothing can be told: a warning, and not lost."""
        if name not in self._nodes:
            node = None
            try:
                with unless(404):  # no such Node: lost
                    node = self._dict(self.core.read_node(name))
                self._nodes[name] = pods.node_lost(node)
            except ApiException as exc:
                if exc.status != 403:
                    raise
                log.warning(f"cannot read Node {name} (HTTP 403: {api_message(exc)}), so cannot tell "
                            "whether it is lost; grant the operator get on nodes (the chart's rbac.nodes)")
                self._nodes[name] = None
        return self._nodes[name]

    def claim(self, name: str) -> dict[str, Any] | None:
        """The PersistentVolumeClaim `name` of this namespace, or None when there is none."""
        with unless(404):
            return self._dict(self.core.read_namespaced_persistent_volume_claim(name, self.namespace))
        return None

    def force_delete_pod(self, name: str, uid: str | None = None) -> bool:
        """Delete a pod at once (grace period 0): for a pod on a lost node, whose kubelet will never
        confirm its end. Only that very pod (`uid`); replaced is fine. False: no such pod (gone already)."""
        body = client.V1DeleteOptions(grace_period_seconds=0,
                                      preconditions=client.V1Preconditions(uid=uid) if uid else None)
        with unless(404):  # gone already
            with unless(409):  # replaced: that pod is gone
                self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0, body=body)
            return True
        return False

    def pod_warnings(self, pod_names: list[str]) -> dict[str, list[dict[str, Any]]]:
        """Warning Events of these pods (mount failures are reported nowhere else). One list per pod, by its
        name: a list of the namespace's pod Events cost every round O(its trainings), 2.7 s of the API
        server's time each at 1,000 trainings (docs/scale.md)."""
        out: dict[str, list[dict[str, Any]]] = {}
        for name in pod_names:
            # resourceVersion "0": from the API server's watch cache, not a quorum read of etcd
            found = self.core.list_namespaced_event(
                self.namespace, resource_version="0",
                field_selector=f"involvedObject.kind=Pod,involvedObject.name={name},type=Warning")
            if found.items:
                out[name] = [{"reason": ev.reason, "message": ev.message} for ev in found.items]
        return out

    def workload_refusals(self, kind: str, name: str) -> list[dict[str, Any]]:
        """The FailedCreate Events of one workload: pods the API server refused to create (a quota, Pod
        Security, a missing ServiceAccount...) leave no other trace, as they never exist."""
        found = self.core.list_namespaced_event(
            self.namespace, resource_version="0",
            field_selector=f"involvedObject.kind={kind},involvedObject.name={name},type=Warning")
        out = []
        for ev in found.items:
            if ev.reason not in pods.CREATE_REFUSED_REASONS:
                continue
            series = ev.series.count if ev.series is not None else None
            last = ev.last_timestamp or ev.event_time or ev.metadata.creation_timestamp
            out.append({"reason": ev.reason, "message": ev.message, "count": series or ev.count or 1,
                        "lastTimestamp": last.isoformat() if last is not None else ""})
        return out

    def create(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """Create a child and return it as created; None when it already exists (an earlier reconcile or
        operator made it)."""
        ns = manifest["metadata"]["namespace"]
        with unless(409):  # it exists already
            if (backend := backends.for_kind(manifest["apiVersion"], manifest["kind"])) is not None:
                created = self.custom.create_namespaced_custom_object(backend.group, backend.version, ns,
                                                                      backend.plural, manifest)
            elif manifest["kind"] == "Service":
                created = self._dict(self.core.create_namespaced_service(
                    ns, cast(client.V1Service, manifest)))
            elif manifest["kind"] == "PersistentVolumeClaim":
                created = self._dict(self.core.create_namespaced_persistent_volume_claim(
                    ns, cast(client.V1PersistentVolumeClaim, manifest)))
            elif manifest["kind"] == "NetworkPolicy":
                created = self._dict(self.networking.create_namespaced_network_policy(
                    ns, cast(client.V1NetworkPolicy, manifest)))
            else:
                raise ValueError(f"no API known for {manifest['apiVersion']} {manifest['kind']}")
            metrics.CHILDREN_CREATED.labels(kind=manifest["kind"]).inc()
            return cast(dict[str, Any], created)
        return None

    def delete(self, ref: dict[str, Any]) -> bool:
        """Delete a child (foreground). False: the API server has no such object (gone already)."""
        body = client.V1DeleteOptions(propagation_policy="Foreground")
        with unless(404):  # gone already
            if (backend := backends.for_kind(ref["apiVersion"], ref["kind"])) is not None:
                self.custom.delete_namespaced_custom_object(backend.group, backend.version, ref["namespace"],
                                                            backend.plural, ref["name"], body=body)
            elif ref["kind"] == "Service":
                self.core.delete_namespaced_service(ref["name"], ref["namespace"], body=body)
            elif ref["kind"] == "NetworkPolicy":
                self.networking.delete_namespaced_network_policy(ref["name"], ref["namespace"], body=body)
            else:
                raise ValueError(f"no API known for {ref['apiVersion']} {ref['kind']}")
            return True
        return False

    def set_suspend(self, backend: backends.Backend, name: str, value: bool) -> None:
        self.custom.patch_namespaced_custom_object(backend.group, backend.version, self.namespace,
                                                   backend.plural, name, backend.suspend_patch(value))

    def queue_workload(self, workload: dict[str, Any]) -> tuple[bool, dict[str, Any] | None]:
        """Kueue's Workload for our workload: (whether Kueue's API is served, the Workload or None).
        Kueue labels it with the owner's uid and sets the owner as its controller."""
        uid = workload["metadata"]["uid"]
        with unless(404):  # Kueue's API is not served
            listed = cast(dict[str, Any], self.custom.list_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, self.namespace, "workloads",
                label_selector=f"{KUEUE_GROUP}/job-uid={uid}"))
            return True, next((w for w in listed["items"] if children.owned_by(w, uid)), None)
        return False, None

    def set_queue_active(self, name: str, value: bool) -> None:
        """Kueue's own suspend switch: an inactive Workload is evicted and stays out of the queue."""
        self.custom.patch_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, self.namespace, "workloads",
                                                   name, {"spec": {"active": value}})

    def patch_status(self, new_status: dict[str, Any]) -> dict[str, Any]:
        """Write the status; returns the PetsTraining as stored now."""
        return cast(dict[str, Any], self.custom.patch_namespaced_custom_object_status(
            api.GROUP, api.VERSION, self.namespace, api.PLURAL, self.name, {"status": new_status}))

    def remove_finalizer(self, finalizer: str, finalizers: list[str], resource_version: str) -> None:
        """Take one finalizer off the PetsTraining; the resourceVersion guards against a concurrent edit
        of the list (409: the next round sees the new list and tries again)."""
        keep = [f for f in finalizers if f != finalizer]
        with unless(404):
            self.custom.patch_namespaced_custom_object(
                api.GROUP, api.VERSION, self.namespace, api.PLURAL, self.name,
                {"metadata": {"finalizers": keep or None, "resourceVersion": resource_version}})

    def delete_training(self) -> None:
        with unless(404):
            self.custom.delete_namespaced_custom_object(
                api.GROUP, api.VERSION, self.namespace, api.PLURAL, self.name,
                body=client.V1DeleteOptions(propagation_policy="Background"))
