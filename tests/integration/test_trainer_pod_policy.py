"""Who may make a pod a training's peer, against a real kube-apiserver: the chart's trainer-pod and
trainer-workload policies (templates/trainer-pod-policy.yaml) as the real helm renders them, bound to one
namespace of this test's, so the other integration tests' stand-in trainer pods and Jobs never meet them.

The NetworkPolicy around a training admits the pods labelled training.pets.dev/training=<name>. A pod
made by hand with that label once reached rank 0's rendezvous; now only the workload controllers may
create one or put the label on one, and the refusal names the label, the value, the chart value and
the user. Those controllers make pods for anyone who may create their workload, and a Job, a CronJob or
a PyTorchJob made by hand with the label in its pod template reached the rendezvous too: now only the
operator's ServiceAccount may create one or put the label in one, and the refusal names the template's
label, the value, the operator and the user.
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
RELEASE_NAMESPACE = f"ops-{SUFFIX}"
OPERATOR_SA = f"p{SUFFIX}-pets-training"  # the chart's ServiceAccount: its full name
OPERATOR = f"system:serviceaccount:{RELEASE_NAMESPACE}:{OPERATOR_SA}"
TENANT = "tenant"  # a person who may create Jobs, CronJobs, Deployments and PyTorchJobs in the namespace
LABEL = "metadata.labels[training.pets.dev/training]"
KUBEFLOW, PYTORCHJOBS = ("kubeflow.org", "v1"), "pytorchjobs"


def pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": api.DEFAULT_IMAGE}]}}


def trainer(training: str) -> dict[str, str]:
    return {api.LABEL_TRAINING: training, api.LABEL_COMPONENT: "trainer"}


def pod_template(labels: dict[str, str]) -> dict[str, Any]:
    container = {"name": "pytorch", "image": api.DEFAULT_IMAGE}
    return {"metadata": {"labels": labels}, "spec": {"restartPolicy": "Never", "containers": [container]}}


def job(name: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    """A suspended Job: its pod template's labels stay mutable, and no pod is made."""
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"suspend": True, "template": pod_template(labels), **spec}}


def cronjob(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name},
            "spec": {"schedule": "* * * * *", "suspend": True,
                     "jobTemplate": {"spec": {"template": pod_template(labels)}}}}


def deployment(name: str, labels: dict[str, str]) -> dict[str, Any]:
    template = pod_template({**labels, "app": name})
    template["spec"]["restartPolicy"] = "Always"
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}}, "template": template}}


def pytorchjob(name: str, replicas: dict[str, dict[str, str]]) -> dict[str, Any]:
    """A PyTorchJob whose replica types (Master, Worker) carry these pod template labels."""
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"runPolicy": {"suspend": True},
                     "pytorchReplicaSpecs": {kind: {"replicas": 1, "restartPolicy": "Never",
                                                    "template": pod_template(labels)}
                                             for kind, labels in replicas.items()}}}


def impersonating(admin: client.ApiClient, user: str) -> client.ApiClient:
    """The API as `user` (admin impersonates it)."""
    api_client = client.ApiClient(admin.configuration)
    api_client.set_default_header("Impersonate-User", user)
    return api_client


def as_user(admin: client.ApiClient, user: str) -> client.CoreV1Api:
    """The core API as `user`, for what the Job controller does."""
    return client.CoreV1Api(impersonating(admin, user))


def create(api_client: client.ApiClient, ns: str, body: dict[str, Any], dry_run: str | None = None) -> Any:
    """Create a Job, CronJob, Deployment or PyTorchJob as the user of `api_client`."""
    kind, options = body["kind"], {"dry_run": dry_run} if dry_run else {}
    if kind == "PyTorchJob":
        return client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            *KUBEFLOW, ns, PYTORCHJOBS, body, **options)
    if kind == "Deployment":
        return client.AppsV1Api(api_client).create_namespaced_deployment(ns, body, **options)
    batch = client.BatchV1Api(api_client)
    if kind == "CronJob":
        return batch.create_namespaced_cron_job(ns, body, **options)
    return batch.create_namespaced_job(ns, body, **options)


def refused_to(api_client: client.ApiClient, ns: str, body: dict[str, Any], path: str, value: str) -> str:
    """The refusal of `body` by the trainer-workload policy, which names the template's label path, the
    value, the kind, the operator and the user, and says what to do."""
    message = refused(lambda: create(api_client, ns, body))
    assert f'{path}.{LABEL}: "{value}" makes the pods of this {body["kind"]} peers' in message, message
    assert "trainingNetworkPolicy.peerAdmission.workloads" in message and f"({OPERATOR})" in message, message
    assert f"not {TENANT}; create a PetsTraining instead" in message, message
    return message


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
    out = sh(tool("helm"), "template", f"p{SUFFIX}", str(CHART), "--namespace", RELEASE_NAMESPACE,
             "--show-only", "templates/trainer-pod-policy.yaml", "--set-json", f'watch.namespaces=["{ns}"]')
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert sorted(d["kind"] for d in docs) == ["ValidatingAdmissionPolicy"] * 2 + \
        ["ValidatingAdmissionPolicyBinding"] * 2
    # The tenant and the operator may create and edit the workloads here (RBAC), so that what refuses
    # them is the policy.
    grant = [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
              "metadata": {"name": "workloads", "namespace": ns},
              "rules": [{"apiGroups": [group], "resources": resources,
                         "verbs": ["create", "get", "update", "patch"]}
                        for group, resources in (("batch", ["jobs", "cronjobs"]), ("apps", ["deployments"]),
                                                 ("kubeflow.org", ["pytorchjobs"]))]},
             {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
              "metadata": {"name": "workloads", "namespace": ns},
              "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "workloads"},
              "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TENANT},
                           {"kind": "ServiceAccount", "namespace": RELEASE_NAMESPACE, "name": OPERATOR_SA}]}]
    sh(tool("kubectl"), "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(docs + grant))

    def in_force() -> bool:
        try:
            core.create_namespaced_pod(ns, pod("probe", trainer("x")), dry_run="All")
        except ApiException as exc:
            try:
                create(admin, ns, job("probe", trainer("x")), dry_run="All")
            except ApiException as exc2:
                return exc.status == exc2.status == 403
        return False

    try:
        wait_for("the trainer-pod and trainer-workload policies to take effect", in_force, 60, 0.5)
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


@pytest.mark.parametrize("route", ["Job", "CronJob", "Deployment"])
def test_a_workload_made_by_hand_cannot_make_a_trainings_peer(admin: client.ApiClient, guarded: str,
                                                              route: str) -> None:
    """The Job controller (the CronJob's through its Jobs; on a cluster whose controllers run as
    system:kube-controller-manager, the ReplicaSet's too) makes the pods of anyone's workload: one whose
    pod template carries the label is refused unless the operator creates it."""
    build, path = {"Job": (job, "spec.template"), "CronJob": (cronjob, "spec.jobTemplate.spec.template"),
                   "Deployment": (deployment, "spec.template")}[route]
    tenant = impersonating(admin, TENANT)
    refused_to(tenant, guarded, build("intruder", trainer("pets")), path, "pets")
    # the same workload without the label is no business of the policy; the operator's is admitted
    create(tenant, guarded, build("plain", {api.LABEL_COMPONENT: "trainer"}), dry_run="All")
    create(impersonating(admin, OPERATOR), guarded, build("pets", trainer("pets")), dry_run="All")
    if route == "CronJob":  # a template without metadata reads as unlabelled, not as an error
        bare = cronjob("bare", {})
        del bare["spec"]["jobTemplate"]["spec"]["template"]["metadata"]
        create(tenant, guarded, bare, dry_run="All")


def test_a_job_copying_the_operators_job_with_a_manual_selector_is_refused(admin: client.ApiClient,
                                                                           guarded: str) -> None:
    """The operator's Job admitted; a person's Job with manualSelector: true, its selector and every label
    copied from the operator's (controller-uid, job-name and the training's), is refused."""
    made = create(impersonating(admin, OPERATOR), guarded, job("copied", trainer("copied")))
    copy = job("impostor", made.spec.template.metadata.labels, manualSelector=True,
               selector={"matchLabels": made.spec.selector.match_labels})
    copy["metadata"]["labels"] = made.metadata.labels or {}
    assert "batch.kubernetes.io/controller-uid" in copy["spec"]["template"]["metadata"]["labels"], copy
    refused_to(impersonating(admin, TENANT), guarded, copy, "spec.template", "copied")


def test_the_operators_job_may_be_touched_but_not_relabelled_and_no_job_may_be_labelled_later(
        admin: client.ApiClient, guarded: str) -> None:
    batch = client.BatchV1Api(impersonating(admin, TENANT))
    create(impersonating(admin, OPERATOR), guarded, job("kept", trainer("kept")))
    # An update that keeps the label passes (Kueue's: a node selector and a label of its own in the
    # template of the suspended Job; the garbage collector's; a person's annotation) ...
    batch.patch_namespaced_job("kept", guarded, {
        "metadata": {"annotations": {"note": "kept"}},
        "spec": {"template": {"metadata": {"labels": {"kueue.x-k8s.io/podset": "main"}},
                              "spec": {"nodeSelector": {"pool": "a"}}}}})
    # ... one that moves the Job's pods to another training does not.
    message = refused(lambda: batch.patch_namespaced_job(
        "kept", guarded, {"spec": {"template": {"metadata": {"labels": {api.LABEL_TRAINING: "other"}}}}}))
    assert f'spec.template.{LABEL}: "other"' in message, message
    kept = batch.read_namespaced_job("kept", guarded)
    assert kept.spec.template.metadata.labels[api.LABEL_TRAINING] == "kept"
    # A suspended Job's pod template labels are mutable: one made without the label cannot get it later.
    create(impersonating(admin, TENANT), guarded, job("later", {"app": "later"}))
    message = refused(lambda: batch.patch_namespaced_job(
        "later", guarded, {"spec": {"template": {"metadata": {"labels": trainer("kept")}}}}))
    assert f'spec.template.{LABEL}: "kept"' in message and f"not {TENANT};" in message, message


def test_a_pytorchjob_made_by_hand_cannot_make_a_trainings_peer(admin: client.ApiClient, guarded: str,
                                                                pytorchjob_crd: str) -> None:
    """Kubeflow's training-operator makes the pods of every replica type: a PyTorchJob with the label in
    any of them is refused unless the operator creates it, and no replica type may get it later."""
    tenant = impersonating(admin, TENANT)
    refused_to(tenant, guarded, pytorchjob("intruder", {"Master": {"app": "x"}, "Worker": trainer("pets")}),
               "spec.pytorchReplicaSpecs[Worker].template", "pets")
    bare = pytorchjob("bare", {"Master": {}, "Worker": {"app": "plain"}})  # Master's template: no metadata
    del bare["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]
    create(tenant, guarded, bare, dry_run="All")
    create(impersonating(admin, OPERATOR), guarded, pytorchjob("pets", {"Master": trainer("pets"),
                                                                        "Worker": trainer("pets")}))
    custom = client.CustomObjectsApi(tenant)
    # An update that keeps every replica type's label passes; one that labels a new replica type does not.
    custom.patch_namespaced_custom_object(*KUBEFLOW, guarded, PYTORCHJOBS, "pets",
                                          {"metadata": {"annotations": {"note": "kept"}}})
    extra = {"spec": {"pytorchReplicaSpecs": {"Extra": pytorchjob("x", {"Extra": trainer("pets")})
                                              ["spec"]["pytorchReplicaSpecs"]["Extra"]}}}
    message = refused(lambda: custom.patch_namespaced_custom_object(
        *KUBEFLOW, guarded, PYTORCHJOBS, "pets", extra))
    assert f'spec.pytorchReplicaSpecs[Extra].template.{LABEL}: "pets"' in message, message
