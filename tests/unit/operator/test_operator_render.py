"""`pets-operator render` refuses what the API server refuses, with the server's words.

Every cross-field rule is one `api.Rule` (CEL and Python twin side by side); these tests run each
rule's example through `render_object` and the CLI, check the CRD carries exactly the records' CEL,
and pin the three specs issue 12 found accepted locally but refused by the server.
tests/integration/test_validation_parity.py submits the same examples to a real API server.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pets_operator import api, cli, render

pytestmark = pytest.mark.unit


def training(name: str = "pets", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name}, "spec": spec}


def example(rule: api.Rule) -> dict[str, Any]:
    return training(rule.example_name, **copy.deepcopy(rule.example_spec))


def refusal(obj: dict[str, Any]) -> str:
    with pytest.raises(api.SpecError) as err:
        render.render_object(obj)
    return str(err.value)


# ---------------------------------------------------------------- every rule, from its record


@pytest.mark.parametrize("rule", api.RULES, ids=lambda r: r.id)
def test_render_refuses_each_rules_example_with_the_rules_message(rule: api.Rule) -> None:
    message = refusal(example(rule))
    assert rule.message in message
    assert message.endswith(f': Invalid value: "object": {rule.message}'), message


@pytest.mark.parametrize("rule", api.RULES, ids=lambda r: r.id)
def test_each_example_breaks_only_its_own_rule(rule: api.Rule) -> None:
    """Otherwise the parity test could pass on another rule's message."""
    obj = example(rule)
    defaulted = {"metadata": obj["metadata"], "spec": api.apply_defaults(api.SPEC_SCHEMA, obj["spec"])}
    assert not list(api._validator().iter_errors(defaulted["spec"])), "the example breaks the schema"
    broken = []
    for other in api.RULES:
        try:
            api.check_rules(defaulted, [other])
        except api.SpecError:
            broken.append(other.id)
    assert broken == [rule.id]


def test_rule_ids_are_unique_and_messages_name_their_field() -> None:
    assert len({r.id for r in api.RULES}) == len(api.RULES)
    for rule in api.RULES:
        assert rule.message.startswith(("spec.", "metadata.")), rule.id
        if rule.field_path:
            assert rule.field_path.startswith("."), rule.id


def _validations(schema: dict[str, Any], at: str, out: dict[str, list[dict[str, str]]]) -> None:
    if schema.get("x-kubernetes-validations"):
        out[at] = schema["x-kubernetes-validations"]
    for key, sub in (schema.get("properties") or {}).items():
        _validations(sub, f"{at}.{key}".lstrip("."), out)
    if isinstance(schema.get("items"), dict):
        _validations(schema["items"], f"{at}[]", out)


def test_the_crd_holds_exactly_the_records_cel() -> None:
    """No CEL is written by hand elsewhere: each x-kubernetes-validations list is its records', in order
    (the immutable-while-running checks are the admission policy's, crd.immutability_policy)."""
    found: dict[str, list[dict[str, str]]] = {}
    _validations(api.object_schema(), "", found)
    root = found.pop("")
    assert root == [r.validation() for r in api.rules_at("")]
    expected = {at: [r.validation() for r in api.rules_at(at)] for at in {r.at for r in api.RULES} if at}
    assert found == expected


def test_every_rule_sits_on_an_object() -> None:
    """Rule.error shows the value as "object", as the server does for a rule on an object."""
    for rule in api.RULES:
        schema: dict[str, Any] = api.object_schema()
        for part in filter(None, rule.at.split(".")):
            schema = schema["properties"][part.removesuffix("[]")]
            if part.endswith("[]"):
                schema = schema["items"]
        assert schema["type"] == "object", rule.id


# ---------------------------------------------------------------- the specs issue 12 names


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"masterPort": 9090},
         'spec.masterPort: Invalid value: "object": spec.masterPort must not be 9090, the trainer\'s '
         "metrics port"),
        ({"pretrained": False, "weights": "/w.safetensors"},
         'spec.weights: Invalid value: "object": spec.weights is a source of pretrained weights, and '
         "spec.pretrained is false: drop spec.weights, or set spec.pretrained: true"),
        ({"processesPerReplica": 4, "resources": {"gpu": 2}},
         'spec.processesPerReplica: Invalid value: "object": spec.processesPerReplica must not exceed '
         "spec.resources.gpu on GPU pods"),
        ({"dataset": {"synthetic": {}, "hostPath": {"path": "/srv/pets"}}},
         'spec.dataset: Invalid value: "object": spec.dataset must set exactly one of synthetic, '
         "persistentVolumeClaim, hostPath"),
        ({"dataset": {}},
         'spec.dataset: Invalid value: "object": spec.dataset must set exactly one of synthetic, '
         "persistentVolumeClaim, hostPath"),
        ({"output": {"emptyDir": {}, "persistentVolumeClaim": {"claimName": "out"}}},
         'spec.output: Invalid value: "object": spec.output must set exactly one of '
         "managedClaim, persistentVolumeClaim, emptyDir"),
        ({"output": {}},
         'spec.output: Invalid value: "object": spec.output must set exactly one of '
         "managedClaim, persistentVolumeClaim, emptyDir"),
        ({"output": {"managedClaim": {"size": "5 Gi"}}},
         'spec.output.managedClaim.size: Invalid value: "object": spec.output.managedClaim.size must be a '
         "non-negative quantity"),
        ({"output": {"persistentVolumeClaim": {"claimName": "out", "readOnly": True}}},
         'spec.output.persistentVolumeClaim.readOnly: Invalid value: "object": '
         "spec.output.persistentVolumeClaim.readOnly must be false: the trainer writes there"),
        ({"env": [{"name": "OK", "value": "1"}, {"name": "PETS_MAIN_ADDR", "value": "x"}]},
         'spec.env[1].name: Invalid value: "object": spec.env[].name must not start with PETS_ or be '
         "one of JOB_COMPLETION_INDEX, RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (they belong to the "
         "pod contract)"),
        ({"env": [{"name": "RANK", "value": "0"}]},
         'spec.env[0].name: Invalid value: "object": spec.env[].name must not start with PETS_'),
    ],
    ids=["master-port-9090", "weights-without-pretrained", "procs-more-than-gpus", "dataset-two",
         "dataset-none", "output-two", "output-none", "output-claim-size", "output-claim-read-only",
         "env-pets-prefix", "env-rank"],
)
def test_render_refuses_what_the_server_refuses(spec: dict[str, Any], expected: str) -> None:
    assert refusal(training(**spec)).startswith(expected)


NAME_RULE = next(r for r in api.RULES if r.id == "name")


@pytest.mark.parametrize(
    "name", ["9lives", "Pets", "pets-", "-pets", "pets.a", "pets_a", "a" * 53, "pets\n", "pé"]
)
def test_render_refuses_bad_names_with_the_name_rule(name: str) -> None:
    assert refusal(training(name)) == f'metadata.name: Invalid value: "object": {NAME_RULE.message}'


@pytest.mark.parametrize("name", ["p", "pets", "pets-2", "a" * 52, "a-b-c9"])
def test_render_accepts_good_names(name: str) -> None:
    assert render.render_object(training(name))


@pytest.mark.parametrize("name", [None, "", 7])
def test_render_requires_a_name(name: Any) -> None:
    assert "metadata.name is required" in refusal(training(name))


# ---------------------------------------------------------------- what passes, and the schema's edges


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"pretrained": True},
        {"weights": "/w.safetensors"},
        {"pretrained": True, "weights": "/w.safetensors"},
        {"pretrainedCache": {"persistentVolumeClaim": {"claimName": "hub", "path": "/hub"}}},
        {"pretrained": False},
        {"masterPort": 29501},
        {"processesPerReplica": 4, "resources": {"gpu": 4}},
        {"processesPerReplica": 4, "resources": {"gpu": 0}},
        {"dataset": {"hostPath": {"path": "/srv/pets"}}},
        {"output": {"persistentVolumeClaim": {"claimName": "out", "readOnly": False}}},
        {"env": [{"name": "HF_HOME", "value": "/output/hf"}, {"name": "MY_PETS_", "value": "x"}]},
        {"weights": None, "pretrained": True, "dataset": None},  # nulls are pruned, then defaulted
    ],
    ids=repr,
)
def test_render_accepts_valid_specs(spec: dict[str, Any]) -> None:
    assert render.render_object(training(**spec))


def test_nulls_are_pruned_and_defaulted_like_the_server() -> None:
    spec = api.resolve_spec({"weights": None, "dataset": None, "nodeSelector": {"a": None}}).to_dict()
    assert "weights" not in spec and spec["dataset"] == api.resolve_spec({}).dataset
    assert spec["nodeSelector"] == {}


def test_patterns_end_where_go_ends_them() -> None:
    """Go's `$` does not match before a final newline; Python's does (jsonschema uses re.search)."""
    with pytest.raises(api.SpecError, match=r"^spec\.env\[0\]\.name: "):
        api.resolve_spec({"env": [{"name": "FOO\n"}]})
    with pytest.raises(api.SpecError, match=r"^spec\.model: "):
        api.resolve_spec({"model": "resnet50d\n"})
    api.resolve_spec({"env": [{"name": "FOO"}], "model": "resnet50d"})


# ---------------------------------------------------------------- the CLI entry


def test_cli_render_prints_the_rules_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "pt.yaml"
    path.write_text(yaml.safe_dump(training(masterPort=9090)))
    assert cli.main(["render", "-f", str(path)]) == 2
    err = capsys.readouterr().err
    assert 'spec.masterPort: Invalid value: "object": spec.masterPort must not be 9090' in err


# ---------------------------------------------------------------- what render prints: the pods' lock-down

REPO = Path(__file__).resolve().parents[3]


def _pod_specs(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    if manifest["kind"] == "Job":
        return [manifest["spec"]["template"]["spec"]]
    if manifest["kind"] == "PyTorchJob":
        return [r["template"]["spec"] for r in manifest["spec"]["pytorchReplicaSpecs"].values()]
    return []


@pytest.mark.parametrize("backend", ["job", "pytorchjob"])
def test_render_backend_decides_auto_and_every_pod_is_locked_down(backend: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`render --backend pytorchjob` renders the sample (backend auto) as a PyTorchJob, as an operator with
    --auto-backend=pytorchjob does; on either backend every trainer pod runs as uid/gid 65532 on a
    read-only root with emptyDirs at /tmp and HOME (what `make lint-k8s` checks with checkov)."""
    assert cli.main(["render", "-f", str(REPO / "petstraining.yaml"), "--backend", backend]) == 0
    manifests = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = {m["kind"] for m in manifests}
    # the sample sets no spec.output (the default, a managed claim) and no spec.networkPolicy (one)
    made = {"PersistentVolumeClaim", "NetworkPolicy"}
    assert kinds == ({"Service", "Job"} | made if backend == "job" else {"PyTorchJob"} | made)
    pods = [p for m in manifests for p in _pod_specs(m)]
    assert len(pods) == (1 if backend == "job" else 2)  # PyTorchJob: Master and Worker
    for pod in pods:
        assert pod["securityContext"]["runAsUser"] == pod["securityContext"]["runAsGroup"] == 65532
        assert pod["securityContext"]["fsGroup"] == 65532
        (c,) = pod["containers"]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert mounts["/tmp"] == "tmp" and mounts["/home/pets"] == "home"
        assert {"name": "tmp", "emptyDir": {}} in pod["volumes"]
        assert {"name": "home", "emptyDir": {}} in pod["volumes"]
