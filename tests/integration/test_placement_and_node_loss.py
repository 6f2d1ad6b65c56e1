"""spec.placement and a lost node, against a real API server (and the real garbage collector).

No kubelet runs here, which is what a lost node looks like from the API server: a pod bound to a node
(spec.nodeName) that is deleted stays Terminating, because only that node's kubelet may confirm its end.
The test makes a Node whose Ready condition is Unknown (as the node controller writes it when the
kubelet stops reporting), binds the Job's pods to it, and plays the taint manager's eviction (a plain
DELETE). The real operator must force-delete the stuck pods (the current attempt's and, while the old
Job's Foreground deletion waits for it, the older attempt's) and restart the gang, uncounted.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from conftest import OperatorThread, job_pod, wait_for
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pets_operator import api, rbac

pytestmark = pytest.mark.integration


def create_training(admin: client.ApiClient, ns: str, name: str, **spec: Any) -> dict[str, Any]:
    body = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name},
            "spec": {"backend": "job", **spec}}
    return client.CustomObjectsApi(admin).create_namespaced_custom_object(  # type: ignore[no-any-return]
        api.GROUP, api.VERSION, ns, api.PLURAL, body)


def training_status(admin: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    got = client.CustomObjectsApi(admin).get_namespaced_custom_object(api.GROUP, api.VERSION, ns, api.PLURAL,
                                                                      name)
    return dict(got.get("status") or {})


def the_job(admin: client.ApiClient, ns: str, name: str) -> client.V1Job:
    batch = client.BatchV1Api(admin)

    def probe() -> client.V1Job | None:
        try:
            return batch.read_namespaced_job(name, ns)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    return wait_for(f"Job {ns}/{name}", probe)


@pytest.fixture()
def lost_node(admin: client.ApiClient) -> Iterator[str]:
    """A Node that stopped responding: Ready Unknown, as the node controller sets it."""
    core = client.CoreV1Api(admin)
    name = f"lost-{secrets.token_hex(3)}"
    core.create_node({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
    core.patch_node_status(name, {"status": {"conditions": [{
        "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
    yield name
    core.delete_node(name)


def bound_pod(admin: client.ApiClient, ns: str, job: client.V1Job, index: int, node: str | None) -> str:
    """One pod of the Job, bound to `node` and Running, or (None) not placed: Pending, Unschedulable."""
    placed = {"type": "PodScheduled", "status": "True" if node else "False",
              "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
              **({} if node else {"reason": "Unschedulable",
                                  "message": "0/2 nodes are available: 2 Insufficient cpu."})}
    return job_pod(admin, ns, job, index, {"phase": "Running" if node else "Pending", "conditions": [placed]},
                   node)


def pod_gone(admin: client.ApiClient, ns: str, name: str) -> bool:
    try:
        client.CoreV1Api(admin).read_namespaced_pod(name, ns)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def test_placement_shapes_the_jobs_pods_server_side(admin: client.ApiClient, operator: OperatorThread,
                                                    namespace: str) -> None:
    create_training(admin, namespace, "spread", replicas=2,
                    placement={"spreadAcrossNodes": True, "nodeLostSeconds": 20},
                    tolerations=[{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                  "effect": "NoExecute", "tolerationSeconds": 90}])
    pod = client.ApiClient().sanitize_for_serialization(the_job(admin, namespace, "spread").spec.template)
    (constraint,) = pod["spec"]["topologySpreadConstraints"]
    # The API server kept the node inclusion policies (a server without them would drop the fields).
    assert constraint == {
        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {api.LABEL_TRAINING: "spread", api.LABEL_COMPONENT: "trainer",
                                          api.LABEL_ATTEMPT: "0"}},
        "nodeTaintsPolicy": "Honor", "nodeAffinityPolicy": "Honor",
    }
    assert pod["metadata"]["labels"][api.LABEL_ATTEMPT] == "0"
    # The user's not-ready toleration wins; ours covers unreachable.
    assert pod["spec"]["tolerations"] == [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 90},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 20},
    ]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["PETS_ATTEMPT"] == "0"


@pytest.mark.parametrize(("placement", "words"), [
    ({"nodeLostSeconds": 4000}, ["spec.placement.nodeLostSeconds", "4000", "3600"]),
    ({"nodeLostSeconds": -5}, ["spec.placement.nodeLostSeconds", "-5", "0"]),
    ({"spreadAcrossNodes": "yes"}, ["spec.placement.spreadAcrossNodes", "boolean"]),  # a type error: no value
])
def test_the_api_server_refuses_a_bad_placement_naming_the_field(
        admin: client.ApiClient, crd: dict[str, Any], namespace: str, placement: dict[str, Any],
        words: list[str]) -> None:
    with pytest.raises(ApiException) as err:
        create_training(admin, namespace, "bad", placement=placement)
    assert err.value.status == 422
    assert all(w in str(err.value.body) for w in words), err.value.body


def test_the_chart_lets_the_operator_read_nodes(operator_config: client.Configuration) -> None:
    authz = client.AuthorizationV1Api(client.ApiClient(operator_config))
    for group, resource, verbs in rbac.CLUSTER:
        for verb in verbs:
            review = authz.create_self_subject_access_review({"spec": {"resourceAttributes": {
                "group": group, "resource": resource, "verb": verb}}})
            assert review.status.allowed, f"the chart does not grant {verb} {resource} cluster-wide"


def test_a_lost_node_force_deletes_its_pods_and_restarts_the_gang_uncounted(
        admin: client.ApiClient, operator: OperatorThread, namespace: str, lost_node: str) -> None:
    core = client.CoreV1Api(admin)
    create_training(admin, namespace, "pets", replicas=2, maxRestarts=0,
                    placement={"spreadAcrossNodes": True})
    job = the_job(admin, namespace, "pets")
    rank0 = bound_pod(admin, namespace, job, 0, lost_node)
    rank1 = bound_pod(admin, namespace, job, 1, lost_node)
    client.BatchV1Api(admin).patch_namespaced_job_status("pets", namespace, {"status": {
        "active": 2, "ready": 2, "startTime": "2026-01-02T03:00:00Z"}})
    wait_for("the training to run", lambda: training_status(admin, namespace, "pets").get("phase")
             == api.RUNNING)

    # The taint manager evicts rank 1 (nodeLostSeconds after the node went Unknown): a graceful DELETE,
    # which no kubelet will ever confirm.
    core.delete_namespaced_pod(rank1, namespace)
    stuck = core.read_namespaced_pod(rank1, namespace)
    assert stuck.metadata.deletion_timestamp is not None, "a pod bound to a node is deleted gracefully"

    # The operator force-deletes it and restarts the gang; the old Job's Foreground deletion then leaves
    # rank 0 Terminating on the same lost node: force-deleted too, so the old Job goes and the new comes.
    wait_for(f"pod {rank1} to be force-deleted", lambda: pod_gone(admin, namespace, rank1))
    wait_for(f"pod {rank0} of the old attempt to be force-deleted", lambda: pod_gone(admin, namespace, rank0))
    new_job = the_job(admin, namespace, "pets-r1")
    wait_for("the old Job to be gone", lambda: all(
        j.metadata.name != "pets" for j in client.BatchV1Api(admin).list_namespaced_job(namespace).items))

    st = training_status(admin, namespace, "pets")
    # maxRestarts 0: a counted restart would have failed it.
    assert st["phase"] == api.RESTARTING and st["restarts"] == 1 and st["disruptions"] == 1
    assert st["attempt"] == 1
    failure = st["lastFailure"]
    assert (failure["cause"], failure["pod"], failure["rank"], failure["node"]) == (
        "NodeLost", rank1, 1, lost_node)
    assert failure["message"] == (f"node {lost_node} stopped responding (Ready Unknown); its pod {rank1} "
                                  "(rank 1) was force-deleted")
    template = new_job.spec.template
    assert template.metadata.labels[api.LABEL_ATTEMPT] == "1"
    assert template.spec.topology_spread_constraints[0].label_selector.match_labels[api.LABEL_ATTEMPT] == "1"
    assert {e.name: e.value for e in template.spec.containers[0].env}["PETS_ATTEMPT"] == "1"

    def node_lost_events() -> list[str] | None:
        found = [e.message for e in core.list_namespaced_event(namespace).items
                 if e.reason == "NodeLost" and e.involved_object.name == "pets"]
        return found if len(found) >= 2 else None

    messages = wait_for("a NodeLost Event for each force-deleted pod", node_lost_events)
    assert any(rank1 in m and lost_node in m for m in messages)
    assert any(rank0 in m and lost_node in m for m in messages)
    restarting = [e.message for e in core.list_namespaced_event(namespace).items if e.reason == "Restarting"]
    assert any("not counted" in m and "stopped responding" in m for m in restarting), restarting
