"""The trainer-pod policy as the real helm renders it (trainingNetworkPolicy.peerAdmission.*).

What its CEL does is checked against a real API server in tests/integration/test_trainer_pod_policy.py;
here: the values reach both policies (trainer pods, trainer workloads), they name the label the
NetworkPolicy selects peers by, the switches work.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from pets_operator import api

from .support import NAMESPACE, RELEASE, Manifest, of_kind, render, run_helm, template_args

pytestmark = pytest.mark.unit

POLICY_NAME = f"{api.PLURAL}.{api.GROUP}-trainer-pods-{NAMESPACE}-{RELEASE}"
WORKLOADS_NAME = f"{api.PLURAL}.{api.GROUP}-trainer-workloads-{NAMESPACE}-{RELEASE}"
OPERATOR = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-pets-training"  # the chart's ServiceAccount


def names(manifest: Manifest) -> list[str]:
    return [d["metadata"]["name"] for d in of_kind(manifest, "ValidatingAdmissionPolicy")]


def ours(manifest: Manifest, kind: str, name: str = POLICY_NAME) -> dict[str, Any]:
    (doc,) = [d for d in of_kind(manifest, kind) if d["metadata"]["name"] == name]
    return doc


def variables(policy: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in policy["spec"]["variables"]}


def test_by_default_only_the_workload_controllers_make_trainer_pods(helm: str) -> None:
    manifest = render(helm)
    policy = ours(manifest, "ValidatingAdmissionPolicy")
    binding = ours(manifest, "ValidatingAdmissionPolicyBinding")
    assert json.loads(variables(policy)["creators"]) == ["system:serviceaccount:kube-system:job-controller",
                                                 "system:kube-controller-manager",
                                                 "system:serviceaccount:kubeflow:training-operator"]
    # the label it guards is the one the operator's NetworkPolicy admits peers by
    (condition,) = policy["spec"]["matchConditions"]
    assert f"'{api.LABEL_TRAINING}' in object.metadata.labels" in condition["expression"]
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["pods"]
    assert binding["spec"] == {"policyName": POLICY_NAME, "validationActions": ["Deny"],
                               "matchResources": {"namespaceSelector": {}}}


def test_creators_and_watched_namespaces_reach_it(helm: str) -> None:
    manifest = render(helm, set_values=(
        "trainingNetworkPolicy.peerAdmission.creators={system:serviceaccount:ml:my-op}",
        "watch.namespaces={team-a}"))
    policy = ours(manifest, "ValidatingAdmissionPolicy")
    assert json.loads(variables(policy)["creators"]) == ["system:serviceaccount:ml:my-op"]
    for name in (POLICY_NAME, WORKLOADS_NAME):
        binding = ours(manifest, "ValidatingAdmissionPolicyBinding", name)
        assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]["values"] == \
            ["team-a"]


def test_by_default_only_the_operator_labels_a_workloads_pod_template(helm: str) -> None:
    """A Job (CronJob, PyTorchJob, ...) made by hand whose pod template carries the label would get a
    peer from its controller, a trusted creator: only the operator's ServiceAccount may label one."""
    manifest = render(helm)
    policy = ours(manifest, "ValidatingAdmissionPolicy", WORKLOADS_NAME)
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]} >= {
        ("batch", "jobs"), ("batch", "cronjobs"), ("kubeflow.org", "pytorchjobs"),
        ("apps", "deployments"), ("apps", "replicasets"), ("apps", "statefulsets"), ("apps", "daemonsets")}
    assert all(rule["operations"] == ["CREATE", "UPDATE"] and rule["apiVersions"] == ["*"] for rule in rules)
    assert variables(policy)["operator"] == f"'{OPERATOR}'"
    assert policy["spec"]["failurePolicy"] == "Fail"
    templates = variables(policy)["templates"]
    # every pod template path it knows, each checked for the label the NetworkPolicy admits peers by
    for path in ("variables.spec.template.metadata.labels", "variables.spec.jobTemplate.spec.template",
                 "ReplicaSpecs"):
        assert path in templates, templates
    assert f"'{api.LABEL_TRAINING}' in " in templates
    assert variables(policy)["oldTemplates"] == templates.replace("variables.spec", "variables.oldSpec")
    (validation,) = policy["spec"]["validations"]
    assert validation["expression"] == \
        "!variables.labelled || request.userInfo.username == variables.operator || variables.unchanged"
    assert "create a PetsTraining instead" in validation["messageExpression"]
    assert "trainingNetworkPolicy.peerAdmission.workloads" in validation["messageExpression"]
    binding = ours(manifest, "ValidatingAdmissionPolicyBinding", WORKLOADS_NAME)
    assert binding["spec"] == {"policyName": WORKLOADS_NAME, "validationActions": ["Deny"],
                               "matchResources": {"namespaceSelector": {}}}


def test_the_operator_is_the_releases_serviceaccount(helm: str) -> None:
    manifest = render(helm, set_values=("serviceAccount.create=false", "serviceAccount.name=existing"))
    policy = ours(manifest, "ValidatingAdmissionPolicy", WORKLOADS_NAME)
    assert variables(policy)["operator"] == f"'system:serviceaccount:{NAMESPACE}:existing'"


def test_the_workloads_reach_it_and_none_leaves_it_out(helm: str) -> None:
    manifest = render(helm, set_values=("trainingNetworkPolicy.peerAdmission.workloads[0].apiGroup=batch",
                                        "trainingNetworkPolicy.peerAdmission.workloads[0].resources={jobs}"))
    policy = ours(manifest, "ValidatingAdmissionPolicy", WORKLOADS_NAME)
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"]) == (["batch"], ["jobs"])
    result = run_helm(helm, *template_args(),
                      "--set-json", "trainingNetworkPolicy.peerAdmission.workloads=[]")
    assert result.returncode == 0, result.stderr
    none = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert names(none).count(POLICY_NAME) == 1 and WORKLOADS_NAME not in names(none)
    assert not [d for d in of_kind(none, "ValidatingAdmissionPolicyBinding")
                if d["metadata"]["name"] == WORKLOADS_NAME]


@pytest.mark.parametrize("setting", ["trainingNetworkPolicy.peerAdmission.enabled=false",
                                     "trainingNetworkPolicy.enabled=false"])
def test_the_switches_turn_it_off(helm: str, setting: str) -> None:
    off = names(render(helm, set_values=(setting,)))
    assert POLICY_NAME not in off and WORKLOADS_NAME not in off


@pytest.mark.parametrize("setting", ["trainingNetworkPolicy.peerAdmission.creators={}",
                                     "trainingNetworkPolicy.peerAdmission.creators={has space}",
                                     "trainingNetworkPolicy.peerAdmission.other=1",
                                     "trainingNetworkPolicy.peerAdmission.workloads[0].apiGroup=batch",
                                     "trainingNetworkPolicy.peerAdmission.workloads[0].resources={jobs/status}",
                                     "trainingNetworkPolicy.peerAdmission.workloads[0].resources={*}",
                                     "trainingNetworkPolicy.peerAdmission.workloads[0].resources={}"])
def test_bad_values_are_refused(helm: str, setting: str) -> None:
    result = run_helm(helm, *template_args(set_values=(setting,)))
    assert result.returncode != 0, f"--set {setting} was accepted"
    assert "peerAdmission" in result.stderr, result.stderr
