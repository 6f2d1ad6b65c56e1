"""The guardrails policy as the real helm renders it from the chart's values (guardrails.*).

What the CEL does with those values is checked against a real API server in
tests/integration/test_guardrails.py; here: the values reach the policy, the switch and the schema work.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from pets_operator import api, crd

from .support import CHART, NAMESPACE, RELEASE, Manifest, of_kind, render, run_helm, template_args

pytestmark = pytest.mark.unit

POLICY_NAME = f"{api.PLURAL}.{api.GROUP}-guardrails-{NAMESPACE}-{RELEASE}"


def guardrails(manifest: Manifest) -> tuple[dict[str, Any], dict[str, Any]]:
    (policy,) = [d for d in of_kind(manifest, "ValidatingAdmissionPolicy")
                 if d["metadata"]["name"] == POLICY_NAME]
    (binding,) = [d for d in of_kind(manifest, "ValidatingAdmissionPolicyBinding")
                  if d["metadata"]["name"] == POLICY_NAME]
    return policy, binding


def allow_lists(policy: dict[str, Any]) -> dict[str, list[str]]:
    """The policy's variables: each a CEL list literal, written as JSON by the template."""
    return {v["name"]: json.loads(v["expression"]) for v in policy["spec"]["variables"]}


def test_defaults_allow_no_host_path_no_service_account_and_the_default_trainer_repository(helm: str) -> None:
    policy, binding = guardrails(render(helm))
    default_repository = api.DEFAULT_IMAGE.rsplit(":", 1)[0]
    assert allow_lists(policy) == {"hostPathPrefixes": [], "imagePrefixes": [default_repository],
                                   "serviceAccountNames": []}
    assert binding["spec"]["policyName"] == POLICY_NAME
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"] == {"namespaceSelector": {}}  # cluster mode: everywhere


def test_values_reach_the_policy(helm: str) -> None:
    manifest = render(helm, set_values=(
        "guardrails.hostPathPrefixes={/srv/pets,/mnt/data/}",
        "guardrails.imagePrefixes={registry.example.com/ml/,localhost:5000/pets}",
        "guardrails.serviceAccountNames={trainer,reader}",
    ))
    assert allow_lists(guardrails(manifest)[0]) == {
        "hostPathPrefixes": ["/srv/pets", "/mnt/data/"],
        "imagePrefixes": ["registry.example.com/ml/", "localhost:5000/pets"],
        "serviceAccountNames": ["trainer", "reader"],
    }


def test_an_empty_image_list_allows_only_the_unset_image(helm: str) -> None:
    result = run_helm(helm, *template_args(), "--set-json", "guardrails.imagePrefixes=[]")
    assert result.returncode == 0, result.stderr
    policy, _ = guardrails([d for d in yaml.safe_load_all(result.stdout) if d])
    assert allow_lists(policy)["imagePrefixes"] == []
    (image_rule,) = [v for v in policy["spec"]["validations"] if "object.spec.image" in v["expression"]]
    assert image_rule["expression"].startswith("!has(object.spec.image) ||"), "an unset image must pass"


@pytest.mark.parametrize(("trainer_image", "repository"), [
    ("mirror.example.com/pets/trainer:0.2.0", "mirror.example.com/pets/trainer"),
    ("mirror.example.com:5000/pets/trainer:0.2.0", "mirror.example.com:5000/pets/trainer"),
    ("mirror.example.com:5000/pets/trainer", "mirror.example.com:5000/pets/trainer"),
    ("mirror.example.com/trainer@sha256:" + "a" * 64, "mirror.example.com/trainer"),
    ("mirror.example.com/trainer:1@sha256:" + "b" * 64, "mirror.example.com/trainer"),
    ("pets-training/trainer:9", "pets-training/trainer"),  # already listed: not twice
])
def test_the_trainer_image_repository_is_allowed_too(helm: str, trainer_image: str, repository: str) -> None:
    policy, _ = guardrails(render(helm, set_values=(f"trainer.image={trainer_image}",)))
    prefixes = allow_lists(policy)["imagePrefixes"]
    assert prefixes[0] == "pets-training/trainer" and repository in prefixes
    assert len(prefixes) == len(set(prefixes)) == (1 if repository == "pets-training/trainer" else 2)


def test_namespaced_mode_binds_only_the_watched_namespaces(helm: str) -> None:
    _, binding = guardrails(render(helm, set_values=("watch.namespaces={team-a,team-b}",)))
    assert binding["spec"]["matchResources"] == {"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}]}}


def test_the_switch_turns_it_off(helm: str) -> None:
    off = render(helm, set_values=("guardrails.enabled=false",))
    names = [d["metadata"]["name"] for d in off if d["kind"].startswith("ValidatingAdmissionPolicy")]
    assert names and POLICY_NAME not in names  # the immutability policy stays


def test_two_releases_get_two_policies(helm: str) -> None:
    result = run_helm(helm, "template", "other", str(CHART), "--namespace", "team-b")
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    other = {d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    assert f"{api.PLURAL}.{api.GROUP}-guardrails-team-b-other" in other and POLICY_NAME not in other


def test_the_policy_is_the_generated_one_with_the_values_in(helm: str) -> None:
    policy, binding = guardrails(render(helm))
    generated_policy, generated_binding = crd.guardrails_policy()
    assert policy["spec"]["validations"] == generated_policy["spec"]["validations"]
    assert policy["spec"]["matchConstraints"] == generated_policy["spec"]["matchConstraints"]
    assert binding["spec"]["validationActions"] == generated_binding["spec"]["validationActions"]


@pytest.mark.parametrize(("setting", "named"), [
    ("guardrails.enabled=maybe", "enabled"),
    ("guardrails.hostPathPrefixes={srv/pets}", "hostPathPrefixes"),
    ("guardrails.hostPathPrefixes={/srv/../etc}", "hostPathPrefixes"),
    ("guardrails.hostPathPrefixes={/srv/pets,/srv/pets}", "hostPathPrefixes"),
    ('guardrails.hostPathPrefixes={/srv/"pets}', "hostPathPrefixes"),
    ("guardrails.imagePrefixes={pets-training/trainer:0.1.0}", "imagePrefixes"),
    ("guardrails.imagePrefixes={pets-training/trainer@sha256:abc}", "imagePrefixes"),
    ("guardrails.imagePrefixes={has space}", "imagePrefixes"),
    ("guardrails.serviceAccountNames={Admin}", "serviceAccountNames"),
    ("guardrails.unknown=1", "unknown"),
])
def test_bad_guardrail_values_are_refused_naming_the_field(helm: str, setting: str, named: str) -> None:
    result = run_helm(helm, *template_args(set_values=(setting,)))
    assert result.returncode != 0, f"--set {setting} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert re.search(rf"\b{re.escape(named)}\b", result.stderr), result.stderr


def test_registry_with_a_port_is_a_valid_prefix(helm: str) -> None:
    policy, _ = guardrails(render(helm, set_values=("guardrails.imagePrefixes={localhost:5000/}",)))
    assert allow_lists(policy)["imagePrefixes"] == ["localhost:5000/"]


def test_values_yaml_documents_every_guardrail() -> None:
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)["guardrails"]
    assert values == {"enabled": True, "hostPathPrefixes": [], "imagePrefixes": ["pets-training/trainer"],
                      "serviceAccountNames": []}
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["guardrails"]
    assert schema["additionalProperties"] is False and set(schema["properties"]) == set(values)
    for key in values:
        assert re.search(rf"# -- .*\n(  # .*\n)*  {key}:", text), f"guardrails.{key} has no comment"
