"""Every spec the API accepts ends visibly (issue 9).

At apply: quantities and the pod fields with Kubernetes' own schema (affinity, tolerations, env...)
are refused by the CRD, naming the field, in the words `pets-operator render` uses.
After apply: a child the API server refuses for good (a ValidatingAdmissionPolicy) ends the
training Failed with the server's message and one Event, leaving no child behind; one refused for
now (a ResourceQuota) keeps it Pending with the reason until the quota allows it.
"""

from __future__ import annotations

import copy
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from conftest import OperatorThread, tool, wait_for
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pets_operator import api, builders, children, render

pytestmark = pytest.mark.integration


def training(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name},
            "spec": {"backend": "job", **copy.deepcopy(spec)}}


# ----------------------------------------------------------------------------- refused at apply

REFUSED_AT_APPLY: list[tuple[str, dict[str, Any], str]] = [
    ("memory-negative", {"resources": {"memory": "-4Gi"}}, "spec.resources.memory"),
    ("cpu-two-points", {"resources": {"cpu": "0.5.5"}}, "spec.resources.cpu"),
    ("size-limit-negative", {"output": {"emptyDir": {"sizeLimit": "-1Gi"}}},
     "spec.output.emptyDir.sizeLimit"),
    ("affinity-word", {"affinity": {"nodeAffinity": "anywhere"}}, "spec.affinity.nodeAffinity"),
    ("cpu-negative-int", {"resources": {"cpu": -1}}, "spec.resources.cpu"),
    ("toleration-seconds-word",
     {"tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": "x"}]},
     "spec.tolerations[0].tolerationSeconds"),
    ("selector-operator", {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Near"}]}]}}}},
     "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
     ".matchExpressions[0].operator"),
    ("env-secret-without-key", {"env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s"}}}]},
     "spec.env[0].valueFrom.secretKeyRef.key"),
    ("node-selector-number", {"nodeSelector": {"zone": 3}}, "spec.nodeSelector.zone"),
    ("pull-secret-extra-field", {"imagePullSecrets": [{"name": "reg", "namespace": "other"}]},
     "spec.imagePullSecrets[0].namespace"),
]


@pytest.mark.parametrize(("case", "spec", "field"), REFUSED_AT_APPLY, ids=[c[0] for c in REFUSED_AT_APPLY])
def test_kubectl_apply_refuses_naming_the_field(crd: dict[str, Any], namespace: str, kubeconfig: str,
                                                case: str, spec: dict[str, Any], field: str) -> None:
    res = subprocess.run([tool("kubectl"), "--kubeconfig", kubeconfig, "apply", "-n", namespace, "-f", "-"],
                         input=yaml.safe_dump(training(f"bad-{case}", spec)), capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode != 0, f"{case}: kubectl apply accepted it: {res.stdout}"
    assert field in res.stderr, f"{case}: the error does not name {field}: {res.stderr}"
    # render refuses it too, naming the same field; for a rule, with the very words of the server.
    with pytest.raises(api.SpecError) as err:
        render.render_object(training(f"bad-{case}", spec))
    local = str(err.value)
    # jsonschema names the object that lacks a required field or has an extra one; the server, the field.
    assert field.startswith(local.split(": ")[0]), local
    if 'Invalid value: "object"' in local:
        assert local in " ".join(res.stderr.split()), f"\nlocal:  {local}\nserver: {res.stderr}"


def create_job_dry_run(admin: client.ApiClient, ns: str, job: dict[str, Any]) -> None:
    """As the operator creates it (a plain JSON body: quantities may be integers); raises if refused."""
    got = client.CustomObjectsApi(admin).create_namespaced_custom_object("batch", "v1", ns, "jobs", job,
                                                                         dry_run="All")
    assert got["kind"] == "Job" and got["metadata"]["name"] == job["metadata"]["name"], got


# Every quantity the rules admit is one the Job API accepts (server-side dry-run of the built Job).
ADMITTED_QUANTITIES = ["1", "0", "500m", "1.5", ".5", "3Gi", "512Mi", "1Ki", "2k", "1E", "1e3", "1E-2", "7T",
                       4]


def test_admitted_quantities_make_jobs_the_server_accepts(admin: client.ApiClient, crd: dict[str, Any],
                                                          namespace: str) -> None:
    custom = client.CustomObjectsApi(admin)
    for value in ADMITTED_QUANTITIES:
        spec = {"resources": {"cpu": value, "memory": value}, "output": {"emptyDir": {"sizeLimit": value}}}
        stored = custom.create_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL,
                                                        training("q", spec), dry_run="All",
                                                        field_validation="Strict")
        resources = stored["spec"]["resources"]
        assert (resources["cpu"], resources["memory"]) == (value, value), resources  # stored as written
        job = children.build_job(api.resolve_spec(stored["spec"]), builders.Target("q", namespace))
        create_job_dry_run(admin, namespace, job)


def test_full_pod_fields_pass_the_crd_and_the_job(admin: client.ApiClient, crd: dict[str, Any],
                                                  namespace: str) -> None:
    spec = {
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In",
                                       "values": ["amd64"]}]}]}},
            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 50, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                                   "labelSelector": {"matchLabels": {"app": "pets"}}}}]},
        },
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
                        {"key": "spot", "operator": "Equal", "value": "yes", "effect": "NoExecute",
                         "tolerationSeconds": 30}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "env": [{"name": "HF_HOME", "value": "/output/hf"},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "MEM_MB", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory",
                                                                      "divisor": "1Mi"}}}],
        "imagePullSecrets": [{"name": "regcred"}],
    }
    stored = client.CustomObjectsApi(admin).create_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, training("full", spec), dry_run="All",
        field_validation="Strict")
    assert stored["spec"] == api.stored_spec(training("full", spec)["spec"])
    job = children.build_job(api.resolve_spec(stored["spec"]), builders.Target("full", namespace))
    create_job_dry_run(admin, namespace, job)


# ----------------------------------------------------------------------------- refused after apply


def get_training(admin: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(admin).get_namespaced_custom_object(  # type: ignore[no-any-return]
        api.GROUP, api.VERSION, ns, api.PLURAL, name)


def create_training(admin: client.ApiClient, ns: str, name: str, spec: dict[str, Any] | None = None) -> None:
    client.CustomObjectsApi(admin).create_namespaced_custom_object(
        api.GROUP, api.VERSION, ns, api.PLURAL, training(name, spec or {}))


def wait_status(admin: client.ApiClient, ns: str, name: str, what: str, ok: Any,
                timeout: float = 60) -> dict[str, Any]:
    seen: list[Any] = [None]

    def probe() -> dict[str, Any] | None:
        st = get_training(admin, ns, name).get("status") or {}
        seen[0] = st
        return st if ok(st) else None

    try:
        return wait_for(f"{ns}/{name}: {what}", probe, timeout)  # type: ignore[no-any-return]
    except pytest.fail.Exception:
        pytest.fail(f"{ns}/{name}: not {what} within {timeout:.0f} s; status: {seen[0]}", pytrace=False)


def condition(st: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions") or [] if c["type"] == ctype), {})


def warnings(admin: client.ApiClient, ns: str, name: str, reason: str) -> list[Any]:
    found = client.CoreV1Api(admin).list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name},involvedObject.kind={api.KIND}").items
    return [e for e in found if e.reason == reason and e.type == "Warning"]


def probe_job(ns: str) -> dict[str, Any]:
    return children.build_job(api.resolve_spec({}), builders.Target("probe", ns))


POLICY_MESSAGE = "spec.template.metadata.labels: a Job in this namespace needs a team label"


@pytest.fixture(params=["Forbidden", None], ids=["reason-forbidden-403", "default-reason-422"])
def job_policy(request: pytest.FixtureRequest, admin: client.ApiClient, namespace: str) -> Iterator[int]:
    """A ValidatingAdmissionPolicy (+ binding) refusing every Job created in `namespace`; yields the
    HTTP status the server answers with (403 with reason Forbidden, 422 by default)."""
    reg = client.AdmissionregistrationV1Api(admin)
    name = f"no-jobs-{namespace}"
    validation: dict[str, Any] = {
        "expression": "has(object.metadata.labels) && 'team' in object.metadata.labels",
        "message": POLICY_MESSAGE}
    if request.param:
        validation["reason"] = request.param
    reg.create_validating_admission_policy({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail", "validations": [validation], "matchConstraints": {"resourceRules": [
            {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE"],
             "resources": ["jobs"]}]}},
    })
    reg.create_validating_admission_policy_binding({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"], "matchResources": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}},
    })
    code: list[int] = []

    def enforced() -> bool:  # the policy reaches the admission plugin a moment after it is stored
        try:
            create_job_dry_run(admin, namespace, probe_job(namespace))
        except ApiException as exc:
            code.append(exc.status)
            return True
        return False

    try:
        wait_for("the ValidatingAdmissionPolicy to refuse Jobs", enforced, 30)
        assert code[-1] == (403 if request.param == "Forbidden" else 422), code
        yield code[-1]
    finally:
        reg.delete_validating_admission_policy_binding(name)
        reg.delete_validating_admission_policy(name)


def test_a_policy_refusing_the_job_fails_the_training_and_leaves_nothing(
        admin: client.ApiClient, operator: OperatorThread, namespace: str, job_policy: int) -> None:
    assert job_policy in (403, 422)  # both are final: a retry of the same Job gets the same answer
    create_training(admin, namespace, "refused")
    st = wait_status(admin, namespace, "refused", "Failed",
                     lambda s: s.get("phase") == api.FAILED, timeout=60)
    assert POLICY_MESSAGE in st["message"], st["message"]
    assert "ValidatingAdmissionPolicy" in st["message"] and "refused Job" in st["message"]
    assert condition(st, "Failed")["reason"] == "ChildRejected"
    wait_for("the ChildRejected Warning Event",
             lambda: warnings(admin, namespace, "refused", "ChildRejected"))
    # Nothing left behind, and nothing retried.
    core, batch = client.CoreV1Api(admin), client.BatchV1Api(admin)
    wait_for("the Service to be deleted", lambda: not core.list_namespaced_service(namespace).items)
    assert not batch.list_namespaced_job(namespace).items
    time.sleep(5)  # absence cannot be waited for: a retry loop would recreate the Service or post again
    assert not core.list_namespaced_service(namespace).items
    assert len(warnings(admin, namespace, "refused", "ChildRejected")) == 1
    assert get_training(admin, namespace, "refused")["status"]["message"] == st["message"]


def test_a_full_quota_keeps_the_training_pending_until_it_allows_the_job(
        admin: client.ApiClient, operator: OperatorThread, namespace: str) -> None:
    core, batch = client.CoreV1Api(admin), client.BatchV1Api(admin)
    core.create_namespaced_resource_quota(namespace, {
        "metadata": {"name": "jobs"}, "spec": {"hard": {"count/jobs.batch": "0"}}})
    create_training(admin, namespace, "quota")
    st = wait_status(admin, namespace, "quota", "waiting on the quota",
                     lambda s: condition(s, "Progressing").get("reason") == "ChildCreateRetrying")
    assert st["phase"] == api.PENDING
    assert f"Job {builders.job_name('quota', 0)}" in st["message"], st
    assert "exceeded quota" in st["message"] or "status unknown for quota" in st["message"], st
    assert not batch.list_namespaced_job(namespace).items
    assert [s.metadata.name for s in core.list_namespaced_service(namespace).items] == ["quota"]
    wait_for("the ChildCreateRetrying Warning Event",
             lambda: warnings(admin, namespace, "quota", "ChildCreateRetrying"))

    core.patch_namespaced_resource_quota("jobs", namespace, {"spec": {"hard": {"count/jobs.batch": "1"}}})
    wait_for("the Job once the quota allows it", lambda: batch.list_namespaced_job(namespace).items, 60)
    st = wait_status(admin, namespace, "quota", "past the quota",
                     lambda s: condition(s, "Progressing").get("reason") not in
                     (None, "ChildCreateRetrying"))
    assert st["phase"] == api.PENDING and "exceeded quota" not in st["message"], st  # (named "quota")
    # The refusal's traces are gone: the Job is the training's, and active.
    assert st["children"]["job"] == builders.job_name("quota", 0) and st["workloadActive"] is True, st
