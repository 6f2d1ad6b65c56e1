"""The running operator against a real API server, under the chart's RBAC.

No kubelet runs here, so no pod ever starts: with the job controller disabled
(KCM_CONTROLLERS='*,-job'), the test plays the Job controller and writes the Jobs' status itself;
the operator must follow. The garbage collector is real, so deletion goes through owner references.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import OperatorThread, TrainerMetrics, free_port, job_pod, wait_for
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pets_operator import api, rbac
from prometheus_client import REGISTRY

pytestmark = pytest.mark.integration

NOW = "%Y-%m-%dT%H:%M:%SZ"


def now() -> str:
    return datetime.now(UTC).strftime(NOW)


def create_training(admin: client.ApiClient, ns: str, name: str, **spec: Any) -> dict[str, Any]:
    body = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name},
            "spec": {"backend": "job", **spec}}
    return client.CustomObjectsApi(admin).create_namespaced_custom_object(  # type: ignore[no-any-return]
        api.GROUP, api.VERSION, ns, api.PLURAL, body)


def get_training(admin: client.ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    try:
        return client.CustomObjectsApi(admin).get_namespaced_custom_object(  # type: ignore[no-any-return]
            api.GROUP, api.VERSION, ns, api.PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def patch_spec(admin: client.ApiClient, ns: str, name: str, spec: dict[str, Any]) -> None:
    client.CustomObjectsApi(admin).patch_namespaced_custom_object(
        api.GROUP, api.VERSION, ns, api.PLURAL, name, {"spec": spec})


def jobs(admin: client.ApiClient, ns: str) -> list[client.V1Job]:
    return list(client.BatchV1Api(admin).list_namespaced_job(ns).items)


def services(admin: client.ApiClient, ns: str) -> list[client.V1Service]:
    return list(client.CoreV1Api(admin).list_namespaced_service(ns).items)


def wait_phase(admin: client.ApiClient, ns: str, name: str, phase: str,
               timeout: float = 60) -> dict[str, Any]:
    seen: list[Any] = [None]

    def probe() -> dict[str, Any] | None:
        pt = get_training(admin, ns, name)
        seen[0] = (pt or {}).get("status")
        return pt if pt and (pt.get("status") or {}).get("phase") == phase else None

    try:
        return wait_for(f"{ns}/{name} to be {phase}", probe, timeout)  # type: ignore[no-any-return]
    except pytest.fail.Exception:
        pytest.fail(f"{ns}/{name} did not become {phase} within {timeout:.0f} s; status: {seen[0]}",
                    pytrace=False)


def the_job(admin: client.ApiClient, ns: str, name: str) -> client.V1Job:
    return wait_for(f"Job {ns}/{name}", lambda: next((j for j in jobs(admin, ns) if j.metadata.name == name
                                                      and not j.metadata.deletion_timestamp), None))


def job_status(admin: client.ApiClient, ns: str, name: str, st: dict[str, Any]) -> None:
    """Play the job controller: write the Job's status as it would."""
    client.BatchV1Api(admin).patch_namespaced_job_status(name, ns, {"status": st})


def run_job(admin: client.ApiClient, ns: str, name: str, n: int) -> None:
    job_status(admin, ns, name, {"startTime": now(), "active": n, "ready": n})


def job_conditions(types: tuple[str, ...], reason: str, message: str) -> list[dict[str, str]]:
    """True conditions as the job controller writes them (1.33 wants the *Target/*Met one first)."""
    t = now()
    return [{"type": c, "status": "True", "reason": reason, "message": message, "lastTransitionTime": t,
             "lastProbeTime": t} for c in types]


def finish_job(admin: client.ApiClient, ns: str, name: str, n: int) -> None:
    started = client.BatchV1Api(admin).read_namespaced_job(name, ns).status.start_time
    job_status(admin, ns, name, {
        "startTime": started.strftime(NOW) if started else now(),
        "active": 0, "ready": 0, "succeeded": n, "completedIndexes": f"0-{n - 1}" if n > 1 else "0",
        "completionTime": now(),
        "conditions": job_conditions(("SuccessCriteriaMet", "Complete"), "CompletionsReached",
                                     "Reached expected number of succeeded pods")})


def fail_job(admin: client.ApiClient, ns: str, name: str) -> None:
    """Rank 1's trainer crashed (its failed pod is kept, as the job controller keeps it), and the Job
    failed: a failure of the training, which counts against maxRestarts."""
    job = client.BatchV1Api(admin).read_namespaced_job(name, ns)
    crashed = {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": now()}}
    job_pod(admin, ns, job, 1, {"phase": "Failed", "containerStatuses": [{
        "name": "trainer", "state": crashed, "ready": False, "restartCount": 0, "image": "trainer",
        "imageID": ""}]})
    job_status(admin, ns, name, {
        "active": 0, "ready": 0, "failed": 1,
        "conditions": job_conditions(("FailureTarget", "Failed"), "BackoffLimitExceeded",
                                     "Job has reached the specified backoff limit")})


def owner_of(obj: Any) -> tuple[str, str, bool]:
    (ref,) = obj.metadata.owner_references
    return ref.kind, ref.name, bool(ref.controller)


def reconciles() -> float:
    return sum(REGISTRY.get_sample_value("pets_operator_reconciles_total", {"result": r}) or 0.0
               for r in ("ok", "error"))


@pytest.mark.parametrize(("group", "resource", "verbs"), rbac.NAMESPACED,
                         ids=[f"{g or 'core'}/{r}" for g, r, _ in rbac.NAMESPACED])
def test_chart_rbac_grants_what_the_operator_uses(operator_config: client.Configuration, namespace: str,
                                                  group: str, resource: str, verbs: tuple[str, ...]) -> None:
    """SelfSubjectAccessReviews as the chart's ServiceAccount, for every permission in pets_operator.rbac."""
    authz = client.AuthorizationV1Api(client.ApiClient(operator_config))
    plural, _, sub = resource.partition("/")
    denied = []
    for verb in verbs:
        review = authz.create_self_subject_access_review({"spec": {"resourceAttributes": {
            "namespace": namespace, "group": group, "resource": plural, "subresource": sub, "verb": verb}}})
        if not review.status.allowed:
            denied.append(verb)
    assert not denied, (f"the chart's RBAC does not grant {denied} on {group or 'core'}/{resource}, "
                        "which the operator uses (see pets_operator/rbac.py and docs/operator.md)")


@pytest.mark.parametrize(("group", "resource", "verbs"), rbac.CLUSTER,
                         ids=[f"{g or 'core'}/{r}" for g, r, _ in rbac.CLUSTER])
def test_chart_rbac_grants_the_cluster_reads_the_operator_uses(
        operator_config: client.Configuration, group: str, resource: str, verbs: tuple[str, ...]) -> None:
    """The same, cluster-wide, for pets_operator.rbac.CLUSTER (nodes, storageclasses)."""
    authz = client.AuthorizationV1Api(client.ApiClient(operator_config))
    denied = [verb for verb in verbs if not authz.create_self_subject_access_review({"spec": {
        "resourceAttributes": {"group": group, "resource": resource, "verb": verb}}}).status.allowed]
    assert not denied, (f"the chart's RBAC does not grant {denied} on {group or 'core'}/{resource} "
                        "cluster-wide, which the operator uses (see pets_operator/rbac.py)")


def test_training_creates_one_service_and_one_job(admin: client.ApiClient, operator: OperatorThread,
                                                  namespace: str) -> None:
    pt = create_training(admin, namespace, "pets", replicas=2, epochs=2)
    job = the_job(admin, namespace, "pets")
    svc = wait_for("the Service", lambda: services(admin, namespace))
    assert len(jobs(admin, namespace)) == 1 and len(svc) == 1
    assert owner_of(job) == (api.KIND, "pets", True) and owner_of(svc[0]) == (api.KIND, "pets", True)
    assert job.metadata.owner_references[0].uid == pt["metadata"]["uid"]
    assert job.spec.completion_mode == "Indexed"
    assert job.spec.completions == job.spec.parallelism == 2
    pod = job.spec.template.spec
    assert pod.subdomain == svc[0].metadata.name
    assert svc[0].spec.cluster_ip == "None" and svc[0].spec.publish_not_ready_addresses is True
    env = {e.name: e.value for e in pod.containers[0].env}
    assert env["PETS_MAIN_ADDR"] == f"pets-0.pets.{namespace}.svc.cluster.local"
    assert env["PETS_NUM_MACHINES"] == "2"
    status = wait_phase(admin, namespace, "pets", api.PENDING)["status"]
    assert status["children"] == {"job": "pets", "service": "pets", "networkPolicy": "pets"}
    assert status["observedGeneration"] == pt["metadata"]["generation"]
    wait_for("a Created event on the PetsTraining", lambda: [
        e for e in client.CoreV1Api(admin).list_namespaced_event(
            namespace, field_selector="involvedObject.name=pets").items
        if e.reason == "Created" and e.involved_object.kind == api.KIND])


def test_status_follows_the_job(admin: client.ApiClient, operator: OperatorThread, namespace: str) -> None:
    create_training(admin, namespace, "pets", replicas=2, epochs=2)
    the_job(admin, namespace, "pets")
    run_job(admin, namespace, "pets", 2)
    st = wait_phase(admin, namespace, "pets", api.RUNNING)["status"]
    assert st["activeReplicas"] == 2 and st["readyReplicas"] == 2 and st["startTime"]
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    finish_job(admin, namespace, "pets", 2)
    st = wait_phase(admin, namespace, "pets", api.SUCCEEDED)["status"]
    assert st["completionTime"]
    assert next(c for c in st["conditions"] if c["type"] == "Succeeded")["status"] == "True"
    assert next(c for c in st["conditions"] if c["type"] == "Progressing")["status"] == "False"
    assert len(jobs(admin, namespace)) == 1


def test_failure_restarts_the_gang_up_to_max_restarts(admin: client.ApiClient, operator: OperatorThread,
                                                      namespace: str) -> None:
    create_training(admin, namespace, "pets", replicas=2, maxRestarts=1)
    first = the_job(admin, namespace, "pets")
    run_job(admin, namespace, "pets", 2)
    wait_phase(admin, namespace, "pets", api.RUNNING)
    fail_job(admin, namespace, "pets")
    # The whole gang is replaced: the old Job goes (garbage collector), attempt 1 gets a new Job.
    second = the_job(admin, namespace, "pets-r1")
    wait_for("the failed attempt's Job to be gone",
             lambda: [j.metadata.name for j in jobs(admin, namespace)] == ["pets-r1"])
    assert second.metadata.uid != first.metadata.uid
    # The round that makes pets-r1 writes the status after it (act: children first): wait for that write.
    st = wait_for("the status to name pets-r1",
                  lambda: (got := (get_training(admin, namespace, "pets") or {}).get("status") or {})
                  .get("children", {}).get("job") == "pets-r1" and got)
    assert st["restarts"] == 1
    assert st["phase"] == api.RESTARTING  # every round from the failure to Running says so (no pod runs here)

    def attempt_1_seen() -> dict[str, Any] | None:  # a round after the one that created pets-r1
        got = (get_training(admin, namespace, "pets") or {}).get("status") or {}
        progressing = next((c for c in got.get("conditions") or [] if c["type"] == "Progressing"), {})
        return got if progressing.get("reason") == "WaitingForPods" else None

    st = wait_for("the operator to see pets-r1 waiting for its pods", attempt_1_seen)
    assert st["phase"] == api.RESTARTING
    env = {e.name: e.value for e in second.spec.template.spec.containers[0].env}
    assert env["PETS_MAIN_ADDR"].startswith("pets-r1-0.pets.")
    # Out of restarts: Failed, and nothing new is created.
    run_job(admin, namespace, "pets-r1", 2)
    wait_phase(admin, namespace, "pets", api.RUNNING)
    fail_job(admin, namespace, "pets-r1")
    st = wait_phase(admin, namespace, "pets", api.FAILED)["status"]
    assert next(c for c in st["conditions"] if c["type"] == "Failed")["reason"] == "MaxRestartsExceeded"
    assert [j.metadata.name for j in jobs(admin, namespace)] == ["pets-r1"]
    reasons = {e.reason for e in client.CoreV1Api(admin).list_namespaced_event(
        namespace, field_selector="involvedObject.name=pets").items}
    assert {"Restarting", "Failed"} <= reasons, reasons


def test_suspend_and_resume_through_the_job(admin: client.ApiClient, operator: OperatorThread,
                                            namespace: str) -> None:
    create_training(admin, namespace, "pets", replicas=2)
    the_job(admin, namespace, "pets")
    run_job(admin, namespace, "pets", 2)
    wait_phase(admin, namespace, "pets", api.RUNNING)
    patch_spec(admin, namespace, "pets", {"suspend": True})
    wait_for("the Job to be suspended", lambda: the_job(admin, namespace, "pets").spec.suspend is True)
    job_status(admin, namespace, "pets", {"active": 0, "ready": 0, "conditions": job_conditions(
        ("Suspended",), "JobSuspended", "Job suspended")})
    wait_phase(admin, namespace, "pets", api.SUSPENDED)
    patch_spec(admin, namespace, "pets", {"suspend": False})
    wait_for("the Job to be resumed", lambda: the_job(admin, namespace, "pets").spec.suspend is False)
    assert len(jobs(admin, namespace)) == 1


def test_created_suspended_makes_a_suspended_job(admin: client.ApiClient, operator: OperatorThread,
                                                 namespace: str) -> None:
    create_training(admin, namespace, "queued", suspend=True)
    assert the_job(admin, namespace, "queued").spec.suspend is True
    wait_phase(admin, namespace, "queued", api.SUSPENDED)


def test_deletion_removes_every_child(admin: client.ApiClient, operator: OperatorThread,
                                      namespace: str) -> None:
    create_training(admin, namespace, "pets", replicas=2)
    the_job(admin, namespace, "pets")
    wait_for("the Service", lambda: services(admin, namespace))
    client.CustomObjectsApi(admin).delete_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, "pets")
    wait_for("the PetsTraining to be gone", lambda: get_training(admin, namespace, "pets") is None)
    wait_for("the garbage collector to remove the Job, the Service and the NetworkPolicy",
             lambda: not jobs(admin, namespace) and not services(admin, namespace)
             and not network_policies(admin, namespace))


def network_policies(admin: client.ApiClient, ns: str) -> dict[str, Any]:
    found = client.NetworkingV1Api(admin).list_namespaced_network_policy(ns).items
    return {p.metadata.name: p for p in found}


def test_each_training_gets_a_network_policy_around_its_pods_unless_it_opts_out(
        admin: client.ApiClient, operator: OperatorThread, namespace: str) -> None:
    """Made by the operator under the chart's RBAC, owned by the training, accepted by the API server
    (networking.k8s.io/v1's own validation); none for spec.networkPolicy: false; and the policy it made is
    deleted when a suspended training turns it off."""
    pt = create_training(admin, namespace, "guarded", replicas=2)
    create_training(admin, namespace, "open", replicas=2, networkPolicy=False)
    policy = wait_for("the NetworkPolicy", lambda: network_policies(admin, namespace).get("guarded"))
    assert owner_of(policy) == (api.KIND, "guarded", True)
    assert policy.metadata.owner_references[0].uid == pt["metadata"]["uid"]
    trainers = the_job(admin, namespace, "guarded").spec.template.metadata.labels
    assert policy.spec.pod_selector.match_labels.items() <= trainers.items()
    assert policy.spec.policy_types == ["Ingress"]
    same_training, progress = policy.spec.ingress
    assert same_training.ports is None and same_training._from[0].pod_selector == policy.spec.pod_selector
    assert [(p.protocol, p.port) for p in progress.ports] == [("TCP", api.METRICS_PORT)]
    the_job(admin, namespace, "open")
    assert "open" not in network_policies(admin, namespace)
    assert "networkPolicy" not in wait_phase(admin, namespace, "open", api.PENDING)["status"]["children"]

    custom = client.CustomObjectsApi(admin)
    custom.patch_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, "guarded",
                                          {"spec": {"suspend": True}})
    wait_for("its workload suspended (status.workloadActive false)", lambda: (get_training(
        admin, namespace, "guarded") or {}).get("status", {}).get("workloadActive") is False)
    custom.patch_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, "guarded",
                                          {"spec": {"networkPolicy": False, "suspend": False}})
    wait_for("the policy it made to go", lambda: "guarded" not in network_policies(admin, namespace))
    wait_for("status.children without it", lambda: "networkPolicy" not in (
        (get_training(admin, namespace, "guarded") or {}).get("status", {}).get("children", {})))


def claims(admin: client.ApiClient, ns: str) -> dict[str, Any]:
    found = client.CoreV1Api(admin).list_namespaced_persistent_volume_claim(ns).items
    return {c.metadata.name: c for c in found}


def test_a_url_dataset_gets_a_shared_cache_claim_and_an_init_container(
        admin: client.ApiClient, operator: OperatorThread, namespace: str) -> None:
    """Two trainings on the same URL: one cache claim, made before the Jobs, owned by neither (it is
    there for the next training on the data), mounted by both Jobs' init containers and trainers."""
    dataset = {"url": "https://example.com/pets.tar.gz", "sha256": "ab" * 32}
    for name in ("first", "second"):
        create_training(admin, namespace, name, replicas=2, dataset=dataset)
    for name in ("first", "second"):
        pod = the_job(admin, namespace, name).spec.template.spec
        (init,) = pod.init_containers
        (volume,) = [v for v in pod.volumes if v.name == "data"]
        assert init.name == "dataset" and init.command == ["pets-dataset-init"]
        assert volume.persistent_volume_claim.claim_name.startswith("pets-dataset-")
    caches = [c for name, c in claims(admin, namespace).items() if name.startswith("pets-dataset-")]
    assert len(caches) == 1, [c.metadata.name for c in caches]
    (cache,) = caches
    assert cache.metadata.owner_references is None, "the cache outlives the trainings"
    assert cache.metadata.annotations[api.ANNOTATION_DATASET_URL] == dataset["url"]
    assert cache.spec.access_modes == ["ReadWriteMany"]


def test_a_managed_output_claim_is_made_before_the_job_and_follows_its_retention_policy(
        admin: client.ApiClient, operator: OperatorThread, namespace: str) -> None:
    create_training(admin, namespace, "kept", replicas=2,
                    output={"managedClaim": {"size": "1Gi", "retentionPolicy": "Retain"}})
    create_training(admin, namespace, "gone", replicas=1, output={"managedClaim": {}})
    for name in ("kept", "gone"):
        job = the_job(admin, namespace, name)
        (volume,) = [v for v in job.spec.template.spec.volumes if v.name == "output"]
        assert volume.persistent_volume_claim.claim_name == f"{name}-output"
    made = claims(admin, namespace)
    kept, gone = made["kept-output"], made["gone-output"]
    assert kept.spec.access_modes == ["ReadWriteMany"] and kept.spec.resources.requests == {"storage": "1Gi"}
    assert gone.spec.access_modes == ["ReadWriteOnce"] and gone.spec.resources.requests == {"storage": "5Gi"}
    assert kept.metadata.owner_references is None, "a Retain claim must outlive its training"
    assert owner_of(gone) == (api.KIND, "gone", True)
    for name in ("kept", "gone"):
        client.CustomObjectsApi(admin).delete_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, name)

    def gone_or_going() -> bool:  # one listing: the claim may go between two
        found = claims(admin, namespace).get("gone-output")
        return found is None or found.metadata.deletion_timestamp is not None

    wait_for("the garbage collector to remove the Delete claim", gone_or_going)
    assert "kept-output" in claims(admin, namespace)
    assert claims(admin, namespace)["kept-output"].metadata.deletion_timestamp is None


@contextlib.contextmanager
def a_storage_class(admin: client.ApiClient, name: str, binding: str, default: bool = False) -> Iterator[str]:
    """A StorageClass binding its claims `binding`, no provisioner serving it (this control plane has
    none of its own)."""
    storage = client.StorageV1Api(admin)
    annotations = {api.DEFAULT_STORAGE_CLASS_ANNOTATION: "true"} if default else {}
    storage.create_storage_class({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                                  "metadata": {"name": name, "annotations": annotations},
                                  "provisioner": "example.com/none", "volumeBindingMode": binding})
    try:
        yield name
    finally:
        try:
            storage.delete_storage_class(name)
        except ApiException as exc:
            if exc.status != 404:  # the test may have taken it away itself
                raise


@pytest.fixture
def default_storage_class(admin: client.ApiClient) -> Iterator[str]:
    """A default class whose claims bind when a pod is scheduled (which never comes here): the operator
    makes the Job at once."""
    with a_storage_class(admin, "pets-default-for-a-test", "WaitForFirstConsumer", default=True) as name:
        yield name


def test_the_pods_are_made_once_an_immediate_claim_is_bound(
        admin: client.ApiClient, operator: OperatorThread, namespace: str) -> None:
    """A class that binds Immediate: the operator makes the claim, and the Job only once the claim is
    bound (here by the PV controller, to a volume made for it), so kube-scheduler never turns the pods
    away for an unbound claim (claim_binding)."""
    with a_storage_class(admin, f"pets-immediate-{namespace}", "Immediate") as storage_class:
        create_training(admin, namespace, "bound", replicas=2,
                        output={"managedClaim": {"storageClassName": storage_class}})
        made = wait_for("the output claim", lambda: claims(admin, namespace).get("bound-output"))

        def progressing_condition() -> dict[str, Any] | None:
            st = (get_training(admin, namespace, "bound") or {}).get("status") or {}
            return next((c for c in st.get("conditions") or [] if c["type"] == "Progressing"), None)

        progressing = wait_for("the Progressing condition", progressing_condition)
        assert progressing["reason"] == "WaitingForClaimBinding", progressing
        assert f"bound-output (StorageClass {storage_class})" in progressing["message"]
        assert not [j for j in jobs(admin, namespace) if j.metadata.name == "bound"]
        volume = f"pets-test-{namespace}"
        client.CoreV1Api(admin).create_persistent_volume({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
            "spec": {"capacity": {"storage": made.spec.resources.requests["storage"]},
                     "accessModes": made.spec.access_modes, "storageClassName": storage_class,
                     "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": "/tmp/pets-test"}}})
        try:
            job = the_job(admin, namespace, "bound")  # the PV controller binds within its 15 s resync
            assert claims(admin, namespace)["bound-output"].status.phase == "Bound"
            (output,) = [v for v in job.spec.template.spec.volumes if v.name == "output"]
            assert output.persistent_volume_claim.claim_name == "bound-output"
        finally:
            client.CoreV1Api(admin).delete_persistent_volume(volume)


def chosen_output(admin: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    """The training's status once the operator has chosen its output."""
    def chosen() -> dict[str, Any] | None:
        st = (get_training(admin, ns, name) or {}).get("status") or {}
        return st if st.get("output") else None
    return wait_for(f"{name}'s status.output", chosen)


def test_without_spec_output_the_operator_chooses_once_and_says_so(
        admin: client.ApiClient, operator: OperatorThread, namespace: str,
        default_storage_class: str) -> None:
    """No spec.output: with a default StorageClass, a claim the operator makes; without one (this control
    plane's own state), an emptyDir, and OutputDurable says so. Each choice is kept in status.output."""
    create_training(admin, namespace, "durable", replicas=2)
    job = the_job(admin, namespace, "durable")
    (volume,) = [v for v in job.spec.template.spec.volumes if v.name == "output"]
    assert volume.persistent_volume_claim.claim_name == "durable-output"
    made = claims(admin, namespace)["durable-output"]
    assert made.spec.access_modes == ["ReadWriteMany"] and made.spec.resources.requests == {"storage": "5Gi"}
    assert made.spec.storage_class_name == default_storage_class  # the API server's DefaultStorageClass
    assert owner_of(made) == (api.KIND, "durable", True)
    st = chosen_output(admin, namespace, "durable")
    assert (st["output"], st["outputReason"]) == (api.default_output(), "OperatorDefault")
    assert st["children"]["outputClaim"] == "durable-output"
    durable = next(c for c in st["conditions"] if c["type"] == "OutputDurable")
    assert (durable["status"], durable["reason"]) == ("True", "ManagedClaim"), durable

    client.StorageV1Api(admin).delete_storage_class(default_storage_class)
    wait_for("the StorageClass gone", lambda: not client.StorageV1Api(admin).list_storage_class(
        field_selector=f"metadata.name={default_storage_class}").items)
    create_training(admin, namespace, "scratch", replicas=2)
    job = the_job(admin, namespace, "scratch")
    (volume,) = [v for v in job.spec.template.spec.volumes if v.name == "output"]
    assert volume.empty_dir is not None and "scratch-output" not in claims(admin, namespace)
    st = chosen_output(admin, namespace, "scratch")
    assert (st["output"], st["outputReason"]) == ({"emptyDir": {}}, "NoDefaultStorageClass")
    durable = next(c for c in st["conditions"] if c["type"] == "OutputDurable")
    assert (durable["status"], durable["reason"]) == ("False", "NoDefaultStorageClass"), durable
    # The first training keeps its claim: its choice is not made again.
    assert chosen_output(admin, namespace, "durable")["output"] == api.default_output()


def test_a_training_is_deleted_even_while_no_operator_runs(admin: client.ApiClient, operator: OperatorThread,
                                                          namespace: str) -> None:
    """No finalizer: deleting waits for no operator, and the garbage collector takes the children (their
    owner references), as it does for a Job's pods."""
    create_training(admin, namespace, "pets", replicas=2)
    the_job(admin, namespace, "pets")
    wait_for("the Service", lambda: services(admin, namespace))
    assert not (get_training(admin, namespace, "pets") or {})["metadata"].get("finalizers")
    operator.stop()
    try:
        client.CustomObjectsApi(admin).delete_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, "pets")
        assert get_training(admin, namespace, "pets") is None  # at once
        wait_for("the garbage collector to remove the Job and the Service",
                 lambda: not jobs(admin, namespace) and not services(admin, namespace))
    finally:
        operator.start()


def test_the_finalizer_older_operators_put_on_is_taken_off(admin: client.ApiClient, operator: OperatorThread,
                                                          namespace: str) -> None:
    """Operators before the work queue ran one kopf daemon per training, which needed a finalizer; the
    trainings they made still carry it. This operator takes it off, keeping anyone else's."""
    body = {"apiVersion": api.API_VERSION, "kind": api.KIND, "spec": {"backend": "job"}, "metadata": {
        "name": "old", "finalizers": [f"{api.GROUP}/operator", "example.com/keep"]}}
    client.CustomObjectsApi(admin).create_namespaced_custom_object(api.GROUP, api.VERSION, namespace,
                                                                   api.PLURAL, body)
    wait_for("the old finalizer to be taken off", lambda: (get_training(admin, namespace, "old") or {}).get(
        "metadata", {}).get("finalizers") == ["example.com/keep"])
    the_job(admin, namespace, "old")
    client.CustomObjectsApi(admin).patch_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, "old", {"metadata": {"finalizers": None}})
    client.CustomObjectsApi(admin).delete_namespaced_custom_object(api.GROUP, api.VERSION, namespace,
                                                                   api.PLURAL, "old")
    wait_for("the training to be gone", lambda: get_training(admin, namespace, "old") is None)


def test_ttl_after_finished_deletes_the_training(admin: client.ApiClient, operator: OperatorThread,
                                                 namespace: str) -> None:
    create_training(admin, namespace, "short", ttlSecondsAfterFinished=1)
    the_job(admin, namespace, "short")
    finish_job(admin, namespace, "short", 1)
    wait_for("the finished training to be deleted after its TTL",
             lambda: get_training(admin, namespace, "short") is None, timeout=60)
    wait_for("its children to be collected",
             lambda: not jobs(admin, namespace) and not services(admin, namespace))


def test_operator_restart_creates_no_duplicates(admin: client.ApiClient, operator: OperatorThread,
                                                namespace: str) -> None:
    for i in range(5):
        create_training(admin, namespace, f"pets-{i}", replicas=2)
    wait_for("5 Jobs", lambda: len(jobs(admin, namespace)) == 5)
    operator.stop()
    try:
        # While it is down, one training's Service disappears: the restarted operator must notice.
        client.CoreV1Api(admin).delete_namespaced_service("pets-3", namespace)
        before = reconciles()
        operator.start()
        wait_for("the restarted operator to reconcile every training",
                 lambda: reconciles() - before >= 5 and len(services(admin, namespace)) == 5)
    finally:
        if operator.thread is None or not operator.thread.is_alive():
            operator.start()
    assert sorted(j.metadata.name for j in jobs(admin, namespace)) == [f"pets-{i}" for i in range(5)]
    assert sorted(s.metadata.name for s in services(admin, namespace)) == [f"pets-{i}" for i in range(5)]


def test_health_and_metrics(admin: client.ApiClient, operator: OperatorThread, namespace: str) -> None:
    port = operator.options.liveness_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
        assert resp.status == 200

    def pending() -> float:
        return REGISTRY.get_sample_value("pets_operator_trainings", {"phase": api.PENDING}) or 0.0

    before, created = pending(), REGISTRY.get_sample_value("pets_operator_children_created_total",
                                                           {"kind": "Job"}) or 0.0
    create_training(admin, namespace, "counted")
    wait_for("the trainings-by-phase gauge to count it", lambda: pending() == before + 1)
    jobs_made = REGISTRY.get_sample_value("pets_operator_children_created_total", {"kind": "Job"}) or 0
    assert jobs_made == created + 1
    assert (REGISTRY.get_sample_value("pets_operator_reconcile_seconds_count") or 0) > 0


def test_pytorchjob_backend(admin: client.ApiClient, operator: OperatorThread, pytorchjob_crd: str,
                            namespace: str) -> None:
    pt = create_training(admin, namespace, "pj", replicas=3, backend="pytorchjob")
    custom = client.CustomObjectsApi(admin)
    pj = wait_for("the PyTorchJob", lambda: custom.list_namespaced_custom_object(
        "kubeflow.org", "v1", namespace, "pytorchjobs")["items"])
    assert len(pj) == 1 and pj[0]["metadata"]["ownerReferences"][0]["uid"] == pt["metadata"]["uid"]
    assert pj[0]["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    assert not jobs(admin, namespace) and not services(admin, namespace)
    st = wait_phase(admin, namespace, "pj", api.PENDING)["status"]
    assert st["backend"] == "pytorchjob" and st["children"] == {"pytorchJob": "pj", "networkPolicy": "pj"}
    assert st["backendReason"] == "spec.backend is pytorchjob"
    t = now()
    custom.patch_namespaced_custom_object_status("kubeflow.org", "v1", namespace, "pytorchjobs", "pj", {
        "status": {"startTime": t, "conditions": [
            {"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "message": "running",
             "lastTransitionTime": t, "lastUpdateTime": t}],
            "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 2}}}})
    assert wait_phase(admin, namespace, "pj", api.RUNNING)["status"]["activeReplicas"] == 3
    # With the PyTorchJob CRD served, `auto` still runs as the operator's --auto-backend (job), and says so.
    create_training(admin, namespace, "auto", replicas=2, backend="auto")
    assert the_job(admin, namespace, "auto").spec.parallelism == 2
    st = wait_phase(admin, namespace, "auto", api.PENDING)["status"]
    assert st["backend"] == "job" and "--auto-backend" in st["backendReason"]


def trainer_pods(admin: client.ApiClient, ns: str, job: str, replicas: int) -> None:
    """Stand-ins for the Job's pods (no kubelet here), labelled as the Job controller labels them (the
    operator watches pods by its own labels): their status says Running, rank 0's at 127.0.0.1,
    where the test's TrainerMetrics serves the progress gauges. The phase follows the pods, so every
    rank needs one."""
    core = client.CoreV1Api(admin)
    template_labels = client.BatchV1Api(admin).read_namespaced_job(job, ns).spec.template.metadata.labels
    for index in range(replicas):
        name = f"{job}-{index}-abcde"
        core.create_namespaced_pod(ns, {
            "metadata": {"name": name, "labels": template_labels | {
                "job-name": job, "batch.kubernetes.io/job-completion-index": str(index)}},
            "spec": {"containers": [{"name": "trainer", "image": api.DEFAULT_IMAGE}]}})
        core.patch_namespaced_pod_status(name, ns, {"status": {
            "phase": "Running", "podIP": f"127.0.0.{index + 1}", "podIPs": [{"ip": f"127.0.0.{index + 1}"}]}})


def terminate_rank0(admin: client.ApiClient, ns: str, job: str, message: str) -> None:
    client.CoreV1Api(admin).patch_namespaced_pod_status(f"{job}-0-abcde", ns, {"status": {
        "phase": "Succeeded",
        "containerStatuses": [{
            "name": "trainer", "image": api.DEFAULT_IMAGE, "imageID": "", "ready": False, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": message}}}]}})


def test_progress_and_summary_are_mirrored(admin: client.ApiClient, operator: OperatorThread,
                                          trainer_metrics: TrainerMetrics, namespace: str) -> None:
    create_training(admin, namespace, "pets", replicas=2, epochs=5)
    the_job(admin, namespace, "pets")
    trainer_metrics.set(epoch=2, total_epochs=5, train_loss=0.75, eval_accuracy=0.5, images_per_second=42.5,
                        elapsed_seconds=60, eta_seconds=90, step=20, steps_total=50)
    trainer_pods(admin, namespace, "pets", 2)
    run_job(admin, namespace, "pets", 2)

    def mirrored() -> dict[str, Any] | None:
        st = (get_training(admin, namespace, "pets") or {}).get("status") or {}
        return st if st.get("progress") == "2/5" and st.get("phase") == api.RUNNING else None

    st = wait_for("rank 0's progress in the status of the running training", mirrored)
    assert st["phase"] == api.RUNNING and st["evalAccuracy"] == 0.5 and st["trainLoss"] == 0.75
    assert st["imagesPerSecond"] == 42.5 and st["etaSeconds"] == 90 and st["lastProgressTime"]
    summary = {"status": "succeeded", "epochs": 5, "final_accuracy": 0.875, "best_accuracy": 0.9,
               "final_train_loss": 0.25, "images_per_second": 50.0, "elapsed_seconds": 147.5, "world_size": 2}
    terminate_rank0(admin, namespace, "pets", json.dumps(summary))
    finish_job(admin, namespace, "pets", 2)
    st = wait_phase(admin, namespace, "pets", api.SUCCEEDED)["status"]
    assert st["summary"] == summary
    assert st["evalAccuracy"] == 0.875 and st["progress"] == "5/5" and st["etaSeconds"] == 0
    # The last progress read was epochs old: every progress field is the summary's final one.
    assert st["elapsedSeconds"] == 147.5 and st["trainLoss"] == 0.25 and st["imagesPerSecond"] == 50.0
    assert st["step"] == st["stepsTotal"] == 50
    assert "0.8750" in st["message"]


def test_namespaced_operator_acts_only_in_its_namespaces(admin: client.ApiClient, operator: OperatorThread,
                                                        operator_config: client.Configuration) -> None:
    """`pets-operator run --namespace A`: trainings in A are handled, those elsewhere are not touched."""
    import dataclasses
    import secrets

    core = client.CoreV1Api(admin)
    watched, other = f"pt-a-{secrets.token_hex(3)}", f"pt-b-{secrets.token_hex(3)}"
    for ns in (watched, other):
        core.create_namespace({"metadata": {"name": ns}})
    operator.stop()  # the cluster-wide one would handle both
    scoped = OperatorThread(operator_config, ["--standalone"])
    scoped.options = dataclasses.replace(scoped.options, namespaces=(watched,))
    try:
        scoped.start()
        create_training(admin, other, "theirs")
        create_training(admin, watched, "mine")
        the_job(admin, watched, "mine")
        wait_phase(admin, watched, "mine", api.PENDING)
        # By now a cluster-wide operator would have handled "theirs" as well (created first).
        theirs = get_training(admin, other, "theirs") or {}
        assert jobs(admin, other) == [] and "status" not in theirs
        assert not theirs["metadata"].get("finalizers")
        client.CustomObjectsApi(admin).delete_namespaced_custom_object(
            api.GROUP, api.VERSION, watched, api.PLURAL, "mine")
        wait_for("the scoped operator to release its training",
                 lambda: get_training(admin, watched, "mine") is None)
    finally:
        scoped.stop()
        operator.start()
    # The cluster-wide operator, back, picks up the other namespace's training.
    the_job(admin, other, "theirs")
    for ns in (watched, other):
        core.delete_namespace(ns)


# ---------------------------------------------------------------- operator replicas as processes

PAUSED = "Pausing operations in favour of"
RESUMED = "Resuming operations after the pause"


class Replica:
    """One `pets-operator run` process; its log goes to a file the test reads."""

    def __init__(self, name: str, kubeconfig: Path, args: list[str], log: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env["KUBECONFIG"] = str(kubeconfig)
        own = ("--liveness-port", "--metrics-port", "--log-format")
        argv = [a for a in args if not a.startswith(own)]
        argv += [f"--liveness-port={free_port()}", "--metrics-port=0", "--log-format=plain"]
        exe = Path(sys.executable).with_name("pets-operator")
        self.name, self.log = name, log
        self.proc = subprocess.Popen([str(exe), *argv], env=env, stdout=log.open("w"),
                                     stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def priority(self) -> int | None:
        found = re.search(r"with priority (\d+)", self.text())
        return int(found.group(1)) if found else None

    def acting(self) -> bool:
        """kopf starts paused and logs each change: acting when its last such line is a resume."""
        text = self.text()
        return text.rfind(RESUMED) > text.rfind(PAUSED)

    def stop(self, timeout: float = 60) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                pytest.fail(f"replica {self.name} did not stop in {timeout:g} s; log:\n{self.text()[-3000:]}")


def write_kubeconfig(path: Path, cfg: client.Configuration) -> Path:
    """The chart ServiceAccount's credentials (the `operator_config` fixture) as a kubeconfig file."""
    token = cfg.api_key["authorization"].removeprefix("Bearer ")
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "test",
                      "cluster": {"server": cfg.host, "certificate-authority": cfg.ssl_ca_cert}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "test", "user": "sa"}}],
    }))
    return path


@pytest.fixture()
def replicas(operator_config: client.Configuration, chart_rbac: dict[str, Any],
             tmp_path: Path) -> Iterator[list[Replica]]:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", operator_config)
    assert "--priority=auto" in chart_rbac["args"], chart_rbac["args"]
    started = [Replica(n, kubeconfig, chart_rbac["args"], tmp_path / f"{n}.log") for n in ("a", "b")]
    yield started
    for replica in started:  # gracefully: a killed replica's peering record would pause others for 60 s
        replica.stop()


# ---------------------------------------------------------------- two replicas (peering)
# Each replica is a real `pets-operator run` process with the chart's arguments (so `--priority=auto`,
# a random priority each) and the chart ServiceAccount's token, as the chart runs `replicaCount: 2`.

# `namespace` before `operator_paused`: the in-process operator is back before the namespace's
# trainings are deleted, so their finalizers are released.
def test_one_replica_acts_and_the_other_takes_over(
    admin: client.ApiClient, operator: OperatorThread, namespace: str, operator_paused: None,
    replicas: list[Replica],
) -> None:
    # Both join the peering: the one with the higher (random) priority acts, the other stays paused.
    wait_for("both replicas to start", lambda: all(r.priority() is not None for r in replicas), timeout=60)
    active, standby = sorted(replicas, key=lambda r: r.priority() or 0, reverse=True)
    assert active.priority() != standby.priority()
    wait_for("the higher-priority replica to act", active.acting, timeout=60)
    wait_for("the other to stand by", lambda: not standby.acting(), timeout=30)

    create_training(admin, namespace, "first", replicas=2)
    the_job(admin, namespace, "first")
    run_job(admin, namespace, "first", 2)
    wait_phase(admin, namespace, "first", api.RUNNING)
    time.sleep(3)  # room for a second Job or a standby's handler, if either were going to happen
    assert [j.metadata.name for j in jobs(admin, namespace)] == ["first"]
    assert "created Job first" in active.text()
    assert "first" not in standby.text(), standby.text()[-3000:]

    stopped_at = time.monotonic()
    active.stop()
    wait_for("the standby to resume", standby.acting, timeout=30)
    handover = time.monotonic() - stopped_at
    # The new active replica follows the training that exists, and handles the ones created after.
    finish_job(admin, namespace, "first", 2)
    wait_phase(admin, namespace, "first", api.SUCCEEDED)
    create_training(admin, namespace, "second", replicas=2)
    the_job(admin, namespace, "second")
    assert "created Job second" in standby.text()
    assert sorted(j.metadata.name for j in jobs(admin, namespace)) == ["first", "second"]
    print(f"hand-over: the standby resumed {handover:.1f} s after SIGTERM to the active replica")
