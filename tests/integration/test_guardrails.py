"""The admin's guardrails (chart values guardrails.*) and the always-refused volume paths, against a real
kube-apiserver.

The guardrails policy is rendered by the real helm from templates/guardrails-policy.yaml twice, as two
namespaced-mode releases would install it: one with guardrail values set (bound to namespace `custom`),
one with the chart's defaults (bound to namespace `defaults`). A third namespace is bound by neither, so
the other integration tests sharing this API server never meet these policies. Each refusal must name
the field, the value and the chart value an admin changes; what the values allow must pass.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
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
CUSTOM_VALUES = [
    "--set-json", 'guardrails.hostPathPrefixes=["/srv/pets"]',
    "--set-json", 'guardrails.imagePrefixes=["registry.example.com/ml/", "pets-training/trainer"]',
    "--set-json", 'guardrails.serviceAccountNames=["trainer"]',
    "--set", "trainer.image=mirror.example.com/pets/trainer:0.1.0",
]


@dataclass(frozen=True)
class Namespaces:
    custom: str  # bound by the policy with CUSTOM_VALUES
    defaults: str  # bound by the policy with the chart's default values
    unbound: str  # bound by neither
    grandfathered: str  # a training created in `custom` before its policy existed


def training(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name}, "spec": spec}


def create(admin: client.ApiClient, ns: str, spec: dict[str, Any], *, dry_run: bool = True) -> None:
    client.CustomObjectsApi(admin).create_namespaced_custom_object(
        api.GROUP, api.VERSION, ns, api.PLURAL, training(f"g-{secrets.token_hex(3)}", spec),
        dry_run="All" if dry_run else None)


def refusal(admin: client.ApiClient, ns: str, spec: dict[str, Any]) -> tuple[int, str]:
    """The server's status code and message for a create it refuses."""
    with pytest.raises(ApiException) as err:
        create(admin, ns, spec)
    body = err.value.body
    return err.value.status, json.loads(body).get("message", body) if body else str(err.value)


def rendered_policy(release: str, ns: str, *values: str) -> list[dict[str, Any]]:
    out = sh(tool("helm"), "template", release, str(CHART), "--namespace", f"ops-{SUFFIX}",
             "--show-only", "templates/guardrails-policy.yaml", "--set-json", f'watch.namespaces=["{ns}"]',
             *values)
    return [d for d in yaml.safe_load_all(out) if d]


def refused_now(admin: client.ApiClient, ns: str, spec: dict[str, Any]) -> bool:
    try:
        create(admin, ns, spec)
    except ApiException as exc:
        return exc.status == 403
    return False


@pytest.fixture(scope="module")
def guarded(admin: client.ApiClient, kubeconfig: str, crd: dict[str, Any]) -> Iterator[Namespaces]:
    core = client.CoreV1Api(admin)
    names = Namespaces(f"gr-custom-{SUFFIX}", f"gr-defaults-{SUFFIX}", f"gr-unbound-{SUFFIX}", "before")
    for ns in (names.custom, names.defaults, names.unbound):
        core.create_namespace({"metadata": {"name": ns}})
    # Made before the policy: an edit that keeps its hostPath must still pass.
    create(admin, names.custom, {"dataset": {"hostPath": {"path": "/"}}, "suspend": True}, dry_run=False)
    grandfathered = client.CustomObjectsApi(admin).list_namespaced_custom_object(
        api.GROUP, api.VERSION, names.custom, api.PLURAL)["items"][0]["metadata"]["name"]
    names = Namespaces(names.custom, names.defaults, names.unbound, grandfathered)
    docs = [*rendered_policy(f"gc{SUFFIX}", names.custom, *CUSTOM_VALUES),
            *rendered_policy(f"gd{SUFFIX}", names.defaults)]
    kubectl = tool("kubectl")
    sh(kubectl, "--kubeconfig", kubeconfig, "apply", "--server-side", "-f", "-",
       stdin=yaml.safe_dump_all(docs))
    try:
        probe = {"dataset": {"hostPath": {"path": "/etc"}}}
        for ns in (names.custom, names.defaults):
            wait_for(f"the guardrails policy to take effect in {ns}",
                     lambda ns=ns: refused_now(admin, ns, probe), 60, 0.5)
        yield names
    finally:
        for doc in reversed(docs):
            sh(kubectl, "--kubeconfig", kubeconfig, "delete", "--ignore-not-found", doc["kind"].lower(),
               doc["metadata"]["name"])
        # The training first, while an operator of this session may hold its finalizer; then the namespaces.
        custom = client.CustomObjectsApi(admin)
        custom.delete_collection_namespaced_custom_object(api.GROUP, api.VERSION, names.custom, api.PLURAL)
        wait_for(f"the PetsTrainings in {names.custom} to be deleted",
                 lambda: not custom.list_namespaced_custom_object(
                     api.GROUP, api.VERSION, names.custom, api.PLURAL)["items"])
        for ns in (names.custom, names.defaults, names.unbound):
            core.delete_namespace(ns)


# ---------------------------------------------------------------- refused: the field, value and chart value

HOST_PATH = ("spec.dataset.hostPath.path", "guardrails.hostPathPrefixes")
IMAGE = ("spec.image", "guardrails.imagePrefixes")
ACCOUNT = ("spec.serviceAccountName", "guardrails.serviceAccountNames")

REFUSED_WITH_VALUES: list[tuple[str, dict[str, Any], tuple[str, str], str]] = [
    ("host-root", {"dataset": {"hostPath": {"path": "/"}}}, HOST_PATH, "/"),
    ("host-sibling", {"dataset": {"hostPath": {"path": "/srv/petsx"}}}, HOST_PATH, "/srv/petsx"),
    ("host-parent", {"dataset": {"hostPath": {"path": "/srv"}}}, HOST_PATH, "/srv"),
    *[(case, {"image": image}, IMAGE, image) for case, image in [
        ("image-elsewhere", "docker.io/evil/miner:1"),
        ("image-longer-name", "pets-training/trainer-evil:1"),
        ("image-sibling-folder", "registry.example.com/mlx/t:1"),
        ("image-tag-then-path", "pets-training/trainer:1/evil"),
    ]],
    ("account-unlisted", {"serviceAccountName": "cluster-admin"}, ACCOUNT, "cluster-admin"),
]


@pytest.mark.parametrize(("case", "spec", "named", "value"), REFUSED_WITH_VALUES,
                         ids=[r[0] for r in REFUSED_WITH_VALUES])
def test_guardrails_refuse_naming_the_field_the_value_and_the_chart_value(
        admin: client.ApiClient, guarded: Namespaces, case: str, spec: dict[str, Any],
        named: tuple[str, str], value: str) -> None:
    status, message = refusal(admin, guarded.custom, spec)
    field, chart_value = named
    assert status == 403, message
    assert f'{field} "{value}"' in message, message
    assert chart_value in message, message
    assert "ValidatingAdmissionPolicy" in message, message


def test_refusal_lists_what_is_allowed(admin: client.ApiClient, guarded: Namespaces) -> None:
    _, message = refusal(admin, guarded.custom, {"image": "quay.io/x/y:1"})
    # The chart's trainer.image repository is allowed beside the listed prefixes.
    assert "(allowed: registry.example.com/ml/, pets-training/trainer, mirror.example.com/pets/trainer)" \
        in message, message


ALLOWED_WITH_VALUES: list[tuple[str, dict[str, Any]]] = [
    ("host-prefix-itself", {"dataset": {"hostPath": {"path": "/srv/pets"}}}),
    ("host-prefix-slash", {"dataset": {"hostPath": {"path": "/srv/pets/"}}}),
    ("host-inside", {"dataset": {"hostPath": {"path": "/srv/pets/oxford/images"}}}),
    ("image-unset", {}),
    ("image-tag", {"image": "pets-training/trainer:0.2.0"}),
    ("image-digest", {"image": "pets-training/trainer@sha256:" + "a" * 64}),
    ("image-below-folder-prefix", {"image": "registry.example.com/ml/team/trainer:3"}),
    ("image-trainer-image-repository", {"image": "mirror.example.com/pets/trainer:0.2.0"}),
    ("account-listed", {"serviceAccountName": "trainer"}),
    ("all-three", {"dataset": {"hostPath": {"path": "/srv/pets/a"}}, "image": "pets-training/trainer:1",
                   "serviceAccountName": "trainer"}),
]


@pytest.mark.parametrize(("case", "spec"), ALLOWED_WITH_VALUES, ids=[a[0] for a in ALLOWED_WITH_VALUES])
def test_guardrails_allow_what_the_values_list(admin: client.ApiClient, guarded: Namespaces, case: str,
                                               spec: dict[str, Any]) -> None:
    create(admin, guarded.custom, spec)


# ---------------------------------------------------------------- the chart's defaults


def test_defaults_allow_no_host_path(admin: client.ApiClient, guarded: Namespaces) -> None:
    status, message = refusal(admin, guarded.defaults, {"dataset": {"hostPath": {"path": "/srv/pets"}}})
    assert status == 403, message
    assert 'spec.dataset.hostPath.path "/srv/pets"' in message, message
    assert "(allowed: none: hostPath datasets are off)" in message, message
    assert "guardrails.hostPathPrefixes" in message, message


def test_defaults_allow_only_the_chart_trainer_repository(admin: client.ApiClient,
                                                          guarded: Namespaces) -> None:
    create(admin, guarded.defaults, {"image": api.DEFAULT_IMAGE})
    create(admin, guarded.defaults, {})
    status, message = refusal(admin, guarded.defaults, {"image": "registry.example.com/ml/trainer:1"})
    assert status == 403 and "(allowed: pets-training/trainer)" in message, message


def test_defaults_allow_no_service_account(admin: client.ApiClient, guarded: Namespaces) -> None:
    status, message = refusal(admin, guarded.defaults, {"serviceAccountName": "trainer"})
    assert status == 403, message
    assert 'spec.serviceAccountName "trainer"' in message and "(allowed: none)" in message, message
    assert "guardrails.serviceAccountNames" in message, message


def test_a_namespace_no_release_watches_is_not_bound(admin: client.ApiClient, guarded: Namespaces) -> None:
    create(admin, guarded.unbound, {"dataset": {"hostPath": {"path": "/srv/other"}},
                                     "serviceAccountName": "anyone"})


# ---------------------------------------------------------------- updates


def _patch(admin: client.ApiClient, ns: str, name: str, body: dict[str, Any]) -> None:
    client.CustomObjectsApi(admin).patch_namespaced_custom_object(
        api.GROUP, api.VERSION, ns, api.PLURAL, name, body, dry_run="All")


def test_an_edit_that_keeps_a_refused_value_passes_and_one_that_sets_it_does_not(
        admin: client.ApiClient, guarded: Namespaces) -> None:
    """The training made before the policy (hostPath /) can still be labelled and suspended; moving its
    dataset is checked like a create."""
    name = guarded.grandfathered
    _patch(admin, guarded.custom, name, {"metadata": {"labels": {"team": "a"}}, "spec": {"suspend": False}})
    _patch(admin, guarded.custom, name, {"spec": {"dataset": {"hostPath": {"path": "/srv/pets/x"}}}})
    with pytest.raises(ApiException) as err:
        _patch(admin, guarded.custom, name, {"spec": {"dataset": {"hostPath": {"path": "/etc"}}}})
    assert err.value.status == 403 and "guardrails.hostPathPrefixes" in str(err.value.body), err.value.body


# ---------------------------------------------------------------- refused always (the CRD's rules)


ALWAYS_REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("same-claim-same-path",
     {"dataset": {"persistentVolumeClaim": {"claimName": "pets", "path": "/data/"}},
      "output": {"persistentVolumeClaim": {"claimName": "pets", "path": "/data"}}},
     "spec.output.persistentVolumeClaim.path"),
    ("output-inside-dataset",
     {"dataset": {"persistentVolumeClaim": {"claimName": "pets", "path": "/data"}},
      "output": {"persistentVolumeClaim": {"claimName": "pets", "path": "/data/runs"}}},
     "spec.output.persistentVolumeClaim.path"),
    ("dataset-inside-output",
     {"dataset": {"persistentVolumeClaim": {"claimName": "pets", "path": "/work/images"}},
      "output": {"persistentVolumeClaim": {"claimName": "pets", "path": "/work"}}},
     "spec.output.persistentVolumeClaim.path"),
    ("host-path-dot-dot", {"dataset": {"hostPath": {"path": "/srv/pets/../../etc"}}},
     "spec.dataset.hostPath.path"),
    ("claim-path-dot-dot", {"dataset": {"persistentVolumeClaim": {"claimName": "pets", "path": "/.."}}},
     "spec.dataset.persistentVolumeClaim.path"),
    ("output-path-dot-dot", {"output": {"persistentVolumeClaim": {"claimName": "out", "path": "/a/../b"}}},
     "spec.output.persistentVolumeClaim.path"),
    ("cache-path-dot-dot",
     {"pretrainedCache": {"persistentVolumeClaim": {"claimName": "hub", "path": "/hub/.."}}},
     "spec.pretrainedCache.persistentVolumeClaim.path"),
]


@pytest.mark.parametrize(("case", "spec", "field"), ALWAYS_REFUSED, ids=[r[0] for r in ALWAYS_REFUSED])
def test_always_refused_volume_paths_name_the_field(admin: client.ApiClient, guarded: Namespaces, case: str,
                                                    spec: dict[str, Any], field: str) -> None:
    """Refused by the CRD in every namespace, bound or not."""
    for ns in (guarded.unbound, guarded.custom):
        status, message = refusal(admin, ns, spec)
        assert status == 422, message
        assert f'{field}: Invalid value: "object": {field} must not' in message, message


@pytest.mark.parametrize("spec", [
    {"dataset": {"persistentVolumeClaim": {"claimName": "pets", "path": "/images"}},
     "output": {"persistentVolumeClaim": {"claimName": "pets", "path": "/runs"}}},
    {"dataset": {"persistentVolumeClaim": {"claimName": "pets", "path": "/data"}},
     "output": {"persistentVolumeClaim": {"claimName": "pets", "path": "/data-runs"}}},
    {"dataset": {"persistentVolumeClaim": {"claimName": "pets"}},
     "output": {"persistentVolumeClaim": {"claimName": "results"}}},
    {"dataset": {"persistentVolumeClaim": {"claimName": "pets", "path": "/a..b/..c"}}},
], ids=["side-by-side", "name-prefix-not-folder", "other-claims", "dots-in-names"])
def test_volume_paths_that_do_not_nest_or_climb_pass(admin: client.ApiClient, guarded: Namespaces,
                                                     spec: dict[str, Any]) -> None:
    create(admin, guarded.unbound, spec)
