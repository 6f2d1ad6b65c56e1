"""Local validation equals the server's: every cross-field rule, refused alike and in the same words.

For each `api.Rule` (parametrized over `api.RULES`, so a new rule is covered by adding its record),
its example spec is submitted to a real kube-apiserver (server-side dry-run create, strict field
validation) and to `pets-operator render`'s checks; both must refuse it, and the server's message must
contain the local error verbatim (`<path>: Invalid value: "object": <rule message>`). Valid specs
pass on both sides and the server stores what `api.resolve_spec` says.
"""

from __future__ import annotations

import copy
import json
from typing import Any, cast

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pets_operator import api, render

pytestmark = pytest.mark.integration


def training(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name},
            "spec": copy.deepcopy(spec)}


def server_create(admin: client.ApiClient, ns: str, body: dict[str, Any]) -> dict[str, Any]:
    """Create as `kubectl apply --dry-run=server` does: nothing is stored, every check runs."""
    created = client.CustomObjectsApi(admin).create_namespaced_custom_object(
        api.GROUP, api.VERSION, ns, api.PLURAL, body, dry_run="All", field_validation="Strict")
    return cast(dict[str, Any], created)


def server_refusal(admin: client.ApiClient, ns: str, body: dict[str, Any]) -> str:
    with pytest.raises(ApiException) as err:
        server_create(admin, ns, body)
    exc = err.value
    message: str = json.loads(exc.body).get("message", exc.body) if exc.body else str(exc)
    assert exc.status == 422, f"HTTP {exc.status}: {message}"
    return message


def local_refusal(body: dict[str, Any]) -> str:
    with pytest.raises(api.SpecError) as err:
        render.render_object(body)
    return str(err.value)


@pytest.mark.parametrize("rule", api.RULES, ids=lambda r: r.id)
def test_server_and_render_refuse_each_rule_alike(admin: client.ApiClient, namespace: str,
                                                  rule: api.Rule) -> None:
    body = training(rule.example_name, rule.example_spec)
    local = local_refusal(body)
    server = server_refusal(admin, namespace, body)
    assert rule.message in local, local
    assert rule.message in server, server
    # The whole local error, field path and all, is what the server says about this rule.
    assert local in server, f"\nlocal:  {local}\nserver: {server}"


def test_the_server_reports_a_rule_as_rule_error_says(admin: client.ApiClient, namespace: str) -> None:
    """Pin the server's format: `<Kind.group> "<name>" is invalid: <path>: Invalid value: "object": <msg>`."""
    rule = next(r for r in api.RULES if r.id == "master-port-not-metrics-port")
    server = server_refusal(admin, namespace, training("pets", rule.example_spec))
    assert server == (f'{api.KIND}.{api.GROUP} "pets" is invalid: spec.masterPort: Invalid value: "object": '
                      f"{rule.message}")


VALID: list[tuple[str, str, dict[str, Any]]] = [
    ("defaults", "pets", {}),
    ("longest-name", "a" * api.MAX_NAME_LENGTH, {}),
    ("pretrained", "pets", {"pretrained": True}),
    ("weights", "pets", {"weights": "/w.safetensors"}),
    ("pretrained-cache", "pets", {"pretrainedCache": {"persistentVolumeClaim": {"claimName": "hub"}}}),
    ("random-init", "pets", {"pretrained": False}),
    ("master-port", "pets", {"masterPort": 29501}),
    ("procs-equal-gpus", "pets", {"processesPerReplica": 4, "resources": {"gpu": 4}}),
    ("procs-on-cpu", "pets", {"processesPerReplica": 4, "resources": {"gpu": 0}}),
    ("host-path-dataset", "pets", {"dataset": {"hostPath": {"path": "/srv/pets"}}}),
    ("writable-output-claim", "pets",
     {"output": {"persistentVolumeClaim": {"claimName": "out", "readOnly": False}}}),
    ("env", "pets",
     {"env": [{"name": "HF_HOME", "value": "/output/hf"}, {"name": "MY_PETS_", "value": "x"}]}),
    ("nulls", "pets", {"weights": None, "pretrained": True, "dataset": None, "nodeSelector": {"a": None}}),
]


@pytest.mark.parametrize(("case", "name", "spec"), VALID, ids=[c[0] for c in VALID])
def test_valid_specs_pass_on_both_sides(admin: client.ApiClient, namespace: str, case: str, name: str,
                                        spec: dict[str, Any]) -> None:
    body = training(name, spec)
    assert render.render_object(body), case
    stored = server_create(admin, namespace, body)
    assert stored["spec"] == api.stored_spec(spec), f"{case}: the server's defaults differ"


# Schema edges where Python's re and Go's regexp used to disagree: both sides refuse.
REFUSED_BY_SCHEMA: list[tuple[str, dict[str, Any], str]] = [
    ("env-name-trailing-newline", {"env": [{"name": "FOO\n"}]}, "spec.env[0].name"),
    ("model-trailing-newline", {"model": "resnet50d\n"}, "spec.model"),
]


@pytest.mark.parametrize(("case", "spec", "field"), REFUSED_BY_SCHEMA, ids=[c[0] for c in REFUSED_BY_SCHEMA])
def test_schema_edges_are_refused_on_both_sides(admin: client.ApiClient, namespace: str, case: str,
                                                spec: dict[str, Any], field: str) -> None:
    body = training("pets", spec)
    assert local_refusal(body).startswith(f"{field}: ")
    assert f"{field}: " in server_refusal(admin, namespace, body)
