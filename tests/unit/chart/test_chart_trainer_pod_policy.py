"""The trainer-pod policy as the real helm renders it (trainingNetworkPolicy.peerAdmission.*).

What its CEL does is checked against a real API server in tests/integration/test_trainer_pod_policy.py;
here: the values reach it, it names the label the NetworkPolicy selects peers by, the switches work.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pets_operator import api

from .support import NAMESPACE, RELEASE, Manifest, of_kind, render, run_helm, template_args

pytestmark = pytest.mark.unit

POLICY_NAME = f"{api.PLURAL}.{api.GROUP}-trainer-pods-{NAMESPACE}-{RELEASE}"


def names(manifest: Manifest) -> list[str]:
    return [d["metadata"]["name"] for d in of_kind(manifest, "ValidatingAdmissionPolicy")]


def ours(manifest: Manifest, kind: str) -> dict[str, Any]:
    (doc,) = [d for d in of_kind(manifest, kind) if d["metadata"]["name"] == POLICY_NAME]
    return doc


def test_by_default_only_the_workload_controllers_make_trainer_pods(helm: str) -> None:
    manifest = render(helm)
    policy = ours(manifest, "ValidatingAdmissionPolicy")
    binding = ours(manifest, "ValidatingAdmissionPolicyBinding")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert json.loads(variables["creators"]) == ["system:serviceaccount:kube-system:job-controller",
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
    creators = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "creators")
    assert json.loads(creators) == ["system:serviceaccount:ml:my-op"]
    binding = ours(manifest, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]["values"] == \
        ["team-a"]


@pytest.mark.parametrize("setting", ["trainingNetworkPolicy.peerAdmission.enabled=false",
                                     "trainingNetworkPolicy.enabled=false"])
def test_the_switches_turn_it_off(helm: str, setting: str) -> None:
    assert POLICY_NAME not in names(render(helm, set_values=(setting,)))


@pytest.mark.parametrize("setting", ["trainingNetworkPolicy.peerAdmission.creators={}",
                                     "trainingNetworkPolicy.peerAdmission.creators={has space}",
                                     "trainingNetworkPolicy.peerAdmission.other=1"])
def test_bad_values_are_refused(helm: str, setting: str) -> None:
    result = run_helm(helm, *template_args(set_values=(setting,)))
    assert result.returncode != 0, f"--set {setting} was accepted"
    assert "peerAdmission" in result.stderr, result.stderr
