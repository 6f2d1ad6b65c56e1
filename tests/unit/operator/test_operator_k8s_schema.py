"""k8s_schema: the Kubernetes schemas embedded in the CRD are structural, complete and deterministic,
and the quantity rules refuse what the API server would refuse, with the server's words."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from pets_operator import api, k8s_schema

pytestmark = pytest.mark.unit

EMBEDDED = {
    "affinity": ("V1PodSpec", "affinity"),
    "tolerations": ("V1PodSpec", "tolerations"),
    "nodeSelector": ("V1PodSpec", "nodeSelector"),
    "env": ("V1Container", "env"),
    "imagePullSecrets": ("V1PodSpec", "imagePullSecrets"),
}


def nodes(schema: dict[str, Any], path: str = "$") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, schema)]
    for key, sub in (schema.get("properties") or {}).items():
        out += nodes(sub, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        out += nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        out += nodes(schema["additionalProperties"], f"{path}{{}}")
    return out


@pytest.mark.parametrize("field", EMBEDDED)
def test_embedded_schemas_are_structural(field: str) -> None:
    """What the API server demands of a CRD schema: a type (or int-or-string) everywhere, no $ref,
    maps as additionalProperties (never with properties), and a description for the docs test."""
    schema = api.SPEC_SCHEMA["properties"][field]
    assert "$ref" not in json.dumps(schema)
    for path, node in nodes(schema):
        assert "type" in node or node.get("x-kubernetes-int-or-string"), path
        assert node.get("description"), path
        assert not ("properties" in node and "additionalProperties" in node), path
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        for req in node.get("required") or []:
            assert req in node["properties"], f"{path}: required {req} is not a property"


def test_affinity_is_the_whole_kubernetes_type() -> None:
    aff = api.SPEC_SCHEMA["properties"]["affinity"]
    assert set(aff["properties"]) == {"nodeAffinity", "podAffinity", "podAntiAffinity"}
    node = aff["properties"]["nodeAffinity"]["properties"]["requiredDuringSchedulingIgnoredDuringExecution"]
    term = node["properties"]["nodeSelectorTerms"]
    assert node["required"] == ["nodeSelectorTerms"] and term["type"] == "array"
    req = term["items"]["properties"]["matchExpressions"]["items"]
    assert req["required"] == ["key", "operator"]
    assert req["properties"]["operator"]["enum"] == ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    pod = aff["properties"]["podAffinity"]["properties"]
    selector = pod["requiredDuringSchedulingIgnoredDuringExecution"]
    labels = selector["items"]["properties"]["labelSelector"]["properties"]["matchLabels"]
    assert labels["type"] == "object" and labels["additionalProperties"]["type"] == "string"


def test_env_keeps_our_bounds_and_rules_on_top_of_the_kubernetes_type() -> None:
    env = api.SPEC_SCHEMA["properties"]["env"]
    item = env["items"]
    assert env["maxItems"] == 64 and item["required"] == ["name"]
    assert item["properties"]["name"]["pattern"] == api.ENV_NAME
    assert [v["message"] for v in item["x-kubernetes-validations"]] == [
        r.message for r in api.rules_at("spec.env[]")]
    divisor = item["properties"]["valueFrom"]["properties"]["resourceFieldRef"]["properties"]["divisor"]
    assert divisor["x-kubernetes-int-or-string"] and divisor["pattern"] == k8s_schema.QUANTITY_PATTERN


def test_generation_is_deterministic_and_does_not_share_nodes() -> None:
    one, two = k8s_schema.field("V1PodSpec", "affinity"), k8s_schema.field("V1PodSpec", "affinity")
    assert json.dumps(one) == json.dumps(two)
    one["properties"]["nodeAffinity"]["description"] = "changed"
    assert two["properties"]["nodeAffinity"]["description"] != "changed"


def test_recursion_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(k8s_schema, "MAX_DEPTH", 2)
    out = k8s_schema.field("V1PodSpec", "affinity")
    deep = out["properties"]["nodeAffinity"]["properties"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert deep == {"type": "object", "description": deep["description"],
                    "x-kubernetes-preserve-unknown-fields": True}


def test_a_cycle_is_left_open() -> None:
    """A model that contains itself (JSONSchemaProps) ends in an open object instead of recursing."""
    out = k8s_schema.schema("V1JSONSchemaProps")
    inner = out["properties"]["not"]
    assert inner.get("x-kubernetes-preserve-unknown-fields") and "properties" not in inner


def test_unknown_model_or_field_is_an_error() -> None:
    with pytest.raises(ValueError, match="no model"):
        k8s_schema.schema("V1NoSuchThing")
    with pytest.raises(ValueError, match="no field"):
        k8s_schema.field("V1PodSpec", "noSuchField")


def test_type_references_of_both_client_styles() -> None:
    assert k8s_schema.schema("List[str]", "x")["items"]["type"] == "string"
    assert k8s_schema.schema("list[str]", "x")["items"]["type"] == "string"
    assert k8s_schema.schema("Dict[str, str]", "x")["additionalProperties"]["type"] == "string"
    assert k8s_schema.schema("dict(str, int)", "x")["additionalProperties"]["type"] == "integer"
    assert k8s_schema.schema("datetime", "x") == {"type": "string", "format": "date-time", "description": "x"}


# ----------------------------------------------------------------------------- quantities

VALID_QUANTITIES: list[Any] = ["1", "0", "500m", "1.5", ".5", "3Gi", "512Mi", "1Ki", "2k", "1E", "1e3",
                               "1E-2", "100n", "12u", "7T", 0, 4]
INVALID_QUANTITIES: list[Any] = ["-4Gi", "0.5.5", "lots", "", "Gi", "1e", "1ki", "1 Gi", "1Gi\n", "+1",
                                 "1.", "1KiB", "0x10", -1, "1Gi3", "1e123"]


@pytest.mark.parametrize("value", VALID_QUANTITIES, ids=repr)
def test_valid_quantities_pass(value: Any) -> None:
    spec = api.resolve_spec({"resources": {"cpu": value, "memory": value},
                             "output": {"emptyDir": {"sizeLimit": value}}})
    assert spec.resources["memory"] == value


@pytest.mark.parametrize("value", INVALID_QUANTITIES, ids=repr)
@pytest.mark.parametrize("where", ["cpu", "memory", "sizeLimit"])
def test_invalid_quantities_are_refused_naming_the_field(value: Any, where: str) -> None:
    spec = ({"output": {"emptyDir": {"sizeLimit": value}}} if where == "sizeLimit"
            else {"resources": {where: value}})
    path = "spec.output.emptyDir.sizeLimit" if where == "sizeLimit" else f"spec.resources.{where}"
    with pytest.raises(api.SpecError) as err:
        api.resolve_spec(spec)
    expected = f'{path}: Invalid value: "object": {path} must be a non-negative quantity'
    assert str(err.value).startswith(expected)


def test_the_kubernetes_quantity_pattern_admits_signs_and_ours_does_not() -> None:
    from pets_operator.rules import _matches

    assert _matches(k8s_schema.QUANTITY_PATTERN, "-1") and not _matches(api.QUANTITY, "-1")
    assert not _matches(k8s_schema.QUANTITY_PATTERN, "0.5.5")


@pytest.mark.parametrize(("spec", "field"), [
    ({"affinity": {"nodeAffinity": "anywhere"}}, "spec.affinity.nodeAffinity"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}},
     "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"),
    ({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "zone", "labelSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}]}}},
     "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector"
     ".matchExpressions[0].operator"),
    ({"affinity": {"nodeAffinty": {}}}, "spec.affinity"),
    ({"tolerations": [{"key": "k", "operator": "Maybe"}]}, "spec.tolerations[0].operator"),
    ({"tolerations": [{"tolerationSeconds": "soon"}]}, "spec.tolerations[0].tolerationSeconds"),
    ({"nodeSelector": {"zone": 1}}, "spec.nodeSelector.zone"),
    ({"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s"}}}]},
     "spec.env[0].valueFrom.secretKeyRef"),
    ({"env": [{"name": "A", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "x"}}}]},
     "spec.env[0].valueFrom.resourceFieldRef.divisor"),
    ({"imagePullSecrets": [{"name": "a", "namespace": "b"}]}, "spec.imagePullSecrets[0]"),
])
def test_bad_pod_fields_are_refused_locally_naming_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(api.SpecError) as err:
        api.resolve_spec(spec)
    assert str(err.value).startswith(f"{field}: "), str(err.value)


def test_good_pod_fields_pass_and_are_kept() -> None:
    spec = {
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "preference": {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}}]}},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": {"kubernetes.io/arch": "amd64"},
        "env": [{"name": "HF_HOME", "value": "/output/hf"},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory",
                                                                   "divisor": "1Mi"}}}],
        "imagePullSecrets": [{"name": "regcred"}],
    }
    resolved = api.resolve_spec(spec).to_dict()
    assert {k: resolved[k] for k in spec} == spec
    jsonschema.Draft4Validator.check_schema(api._json_schema(api.SPEC_SCHEMA))
