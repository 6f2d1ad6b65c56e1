"""Guardrails: the committed policy template is the generator's, and the always-refused volume paths
(rules output-not-in-dataset and *-path-no-parent) refuse and pass what they should in `render`.

tests/integration/test_guardrails.py submits the same kinds of specs to a real API server, and
tests/integration/test_validation_parity.py each rule's example.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pets_operator import api, crd

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
TEMPLATE = ROOT / "charts" / "pets-training" / crd.GUARDRAILS_TEMPLATE


def test_committed_guardrails_template_matches_generator() -> None:
    text = TEMPLATE.read_text()
    body = text.split("{{- if .Values.guardrails.enabled }}\n", 1)[1].rsplit("{{- end }}", 1)[0]
    assert body == crd.guardrails_policy_yaml(), (
        f"{TEMPLATE} is stale: paste the output of crd.guardrails_policy_yaml() between its if and end lines")
    assert "HELM__" not in body, "a placeholder was left in"


def test_the_policy_checks_creates_and_spec_updates_one_validation_per_guardrail() -> None:
    policy, binding = crd.guardrails_policy()
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["CREATE", "UPDATE"] and rule["resources"] == [api.PLURAL]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    fields = ["spec.dataset.hostPath.path", "spec.image", "spec.serviceAccountName"]
    values = ["guardrails.hostPathPrefixes", "guardrails.imagePrefixes", "guardrails.serviceAccountNames"]
    validations = policy["spec"]["validations"]
    assert len(validations) == len(fields)
    for validation, field, value in zip(validations, fields, values, strict=True):
        for text in (validation["message"], validation["messageExpression"]):
            assert text.lstrip("'").startswith(field) and value in text, text
        # The value itself is in the message, and what is allowed.
        assert f"object.{field}" in validation["messageExpression"]
        assert "(allowed: '" in validation["messageExpression"]
        # An edit keeping the field as it was passes (trainings older than the policy stay manageable).
        assert "oldObject != null" in validation["expression"]


# ---------------------------------------------------------------- refused always, with render's words


def refusal(spec: dict[str, Any]) -> str:
    with pytest.raises(api.SpecError) as err:
        api.resolve_spec(spec)
    return str(err.value)


def claims(dataset_path: str | None, output_path: str | None, output_claim: str = "pets") -> dict[str, Any]:
    dataset: dict[str, Any] = {"claimName": "pets"} | ({"path": dataset_path} if dataset_path else {})
    output: dict[str, Any] = {"claimName": output_claim} | ({"path": output_path} if output_path else {})
    return {"dataset": {"persistentVolumeClaim": dataset}, "output": {"persistentVolumeClaim": output}}


NESTED = [
    ("both-root", claims(None, None)),
    ("equal", claims("/data", "/data")),
    ("equal-trailing-slash", claims("/data/", "/data")),
    ("output-inside", claims("/data", "/data/runs")),
    ("dataset-inside", claims("/work/images", "/work/")),
    ("dataset-root", claims("/", "/runs")),
]


@pytest.mark.parametrize("spec", [s for _, s in NESTED], ids=[i for i, _ in NESTED])
def test_output_in_or_around_the_dataset_folder_is_refused(spec: dict[str, Any]) -> None:
    rule = next(r for r in api.RULES if r.id == "output-not-in-dataset")
    assert refusal(spec) == f'spec.output.persistentVolumeClaim.path: Invalid value: "object": {rule.message}'
    assert "same claim" in rule.message and "inside" in rule.message


APART = [
    ("side-by-side", claims("/images", "/runs")),
    ("name-prefix-is-not-a-folder", claims("/data", "/data-runs")),
    ("name-prefix-other-way", claims("/data-runs/", "/data")),
    ("another-claim", claims(None, None, output_claim="results")),
]


@pytest.mark.parametrize("spec", [s for _, s in APART], ids=[i for i, _ in APART])
def test_output_beside_the_dataset_or_on_another_claim_passes(spec: dict[str, Any]) -> None:
    assert api.resolve_spec(spec).output == spec["output"] | {
        "persistentVolumeClaim": {"path": "/", "readOnly": False} | spec["output"]["persistentVolumeClaim"]}


PATHS = {
    "spec.dataset.persistentVolumeClaim.path":
        lambda p: {"dataset": {"persistentVolumeClaim": {"claimName": "pets", "path": p}}},
    "spec.dataset.hostPath.path": lambda p: {"dataset": {"hostPath": {"path": p}}},
    "spec.output.persistentVolumeClaim.path":
        lambda p: {"output": {"persistentVolumeClaim": {"claimName": "out", "path": p}}},
    "spec.pretrainedCache.persistentVolumeClaim.path":
        lambda p: {"pretrainedCache": {"persistentVolumeClaim": {"claimName": "hub", "path": p}}},
}


@pytest.mark.parametrize("field", list(PATHS))
@pytest.mark.parametrize("path", ["/..", "/../etc", "/a/../b", "/a/..", "/a/../../"])
def test_a_parent_segment_in_any_volume_path_is_refused(field: str, path: str) -> None:
    message = refusal(PATHS[field](path))
    assert message.startswith(f'{field}: Invalid value: "object": {field} must not have a \'..\' segment')


@pytest.mark.parametrize("field", list(PATHS))
@pytest.mark.parametrize("path", ["/", "/a..b", "/..a/b..", "/a/.../b", "/a/./b"])
def test_dots_inside_names_pass(field: str, path: str) -> None:
    api.resolve_spec(PATHS[field](path))


def test_every_volume_path_of_the_schema_has_its_rule() -> None:
    """A new path field of a volume would need its own rule: find them all in the schema."""

    def paths(schema: dict[str, Any], at: str) -> list[str]:
        found = [at] if at.endswith(".path") and schema.get("type") == "string" else []
        for key, sub in (schema.get("properties") or {}).items():
            found += paths(sub, f"{at}.{key}")
        return found

    ruled = {r.field_path for r in api.RULES if r.id.endswith("-path-no-parent")}
    assert {p.removeprefix("spec") for p in paths(api.SPEC_SCHEMA, "spec")} == ruled
