"""Who may make a pod a training's peer, against a real kube-apiserver: the chart's trainer-pod policy
(templates/trainer-pod-policy.yaml) as the real helm renders it, bound to one namespace of this test's,
so the other integration tests' stand-in trainer pods never meet it.

The NetworkPolicy around a training admits the pods labelled training.pets.dev/training=<name>. A pod
made by hand with that label once reached rank 0's rendezvous; now only the workload controllers may
create one or put the label on one, and the refusal names the label, the value, the chart value and
the user.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import sh, tool
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pets_operator import api
from polling import wait_for

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[2] / "charts" / "pets-training"
SUFFIX = secrets.token_hex(3)
JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"


def pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": api.DEFAULT_IMAGE}]}}


def trainer(training: str) -> dict[str, str]:
    return {api.LABEL_TRAINING: training, api.LABEL_COMPONENT: "trainer"}


def as_user(admin: client.ApiClient, user: str) -> client.CoreV1Api:
    """The API as `user` (admin impersonates it), for what the Job controller does."""
    api_client = client.ApiClient(admin.configuration)
    api_client.set_default_header("Impersonate-User", user)
    return client.CoreV1Api(api_client)


def refused(call: Any) -> str:
    with pytest.raises(ApiException) as err:
        call()
    assert err.value.status == 403, err.value.body
    return str(json.loads(err.value.body)["message"])


@pytest.fixture(scope="module")
def guarded(admin: client.ApiClient) -> Iterator[str]:
    """A namespace the policy binds (a namespaced-mode release watching it); the policy in force."""
    core = client.CoreV1Api(admin)
    ns = f"peers-{SUFFIX}"
    core.create_namespace({"metadata": {"name": ns}})
    out = sh(tool("helm"), "template", f"p{SUFFIX}", str(CHART), "--namespace", f"ops-{SUFFIX}",
             "--show-only", "templates/trainer-pod-policy.yaml", "--set-json", f'watch.namespaces=["{ns}"]')
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert [d["kind"] for d in docs] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    sh(tool("kubectl"), "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(docs))

    def in_force() -> bool:
        try:
            core.create_namespaced_pod(ns, pod("probe", trainer("x")), dry_run="All")
        except ApiException as exc:
            return exc.status == 403
        return False

    try:
        wait_for("the trainer-pod policy to take effect", in_force, 60, 0.5)
        yield ns
    finally:
        sh(tool("kubectl"), "delete", "--ignore-not-found", "-f", "-", stdin=yaml.safe_dump_all(docs))
        core.delete_namespace(ns)


def test_a_pod_made_by_hand_cannot_be_a_trainings_peer(admin: client.ApiClient, guarded: str) -> None:
    core = client.CoreV1Api(admin)
    message = refused(lambda: core.create_namespaced_pod(guarded, pod("intruder", trainer("pets"))))
    assert 'metadata.labels[training.pets.dev/training]: "pets"' in message, message
    assert "trainingNetworkPolicy.peerAdmission.creators" in message and JOB_CONTROLLER in message, message
    assert "), not " in message and "create a PetsTraining instead" in message, message  # names the user
    # nor can one made without the label be given it afterwards
    core.create_namespaced_pod(guarded, pod("plain", {"app": "plain"}))
    refused(lambda: core.patch_namespaced_pod("plain", guarded, {"metadata": {"labels": trainer("pets")}}))
    # a pod labelled otherwise is no business of the policy
    core.create_namespaced_pod(guarded, pod("other", {api.LABEL_COMPONENT: "trainer"}), dry_run="All")


def test_the_job_controller_makes_them_and_others_may_touch_them_but_not_move_them(
        admin: client.ApiClient, guarded: str) -> None:
    controller = as_user(admin, JOB_CONTROLLER)
    controller.create_namespaced_pod(guarded, pod("pets-0", trainer("pets")))
    core = client.CoreV1Api(admin)
    # An update that keeps the label passes (the garbage collector's, a person's annotation) ...
    core.patch_namespaced_pod("pets-0", guarded, {"metadata": {"annotations": {"note": "kept"}}})
    # ... one that moves the pod to another training does not.
    message = refused(lambda: core.patch_namespaced_pod(
        "pets-0", guarded, {"metadata": {"labels": {api.LABEL_TRAINING: "other"}}}))
    assert '"other"' in message, message
    assert core.read_namespaced_pod("pets-0", guarded).metadata.labels[api.LABEL_TRAINING] == "pets"
