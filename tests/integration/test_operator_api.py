"""The PetsTraining API on a real kube-apiserver: the CRD's validation and every built manifest.

No operator runs here: these tests talk to the API server only (CRD schema, CEL rules, server-side
dry-run of what the builders make, the real Kubeflow PyTorchJob CRD).
"""

from __future__ import annotations

import copy
import json
import subprocess
from typing import Any

import pytest
import yaml
from conftest import REPO, sh, tool
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pets_operator import api, backends, builders

pytestmark = pytest.mark.integration


def training(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name}, "spec": spec}


def create(admin: client.ApiClient, ns: str, body: dict[str, Any], dry_run: str | None = None) -> Any:
    """Create as `kubectl apply` does: strict field validation (unknown fields are errors)."""
    kwargs: dict[str, Any] = {"field_validation": "Strict"}
    if dry_run:
        kwargs["dry_run"] = dry_run
    return client.CustomObjectsApi(admin).create_namespaced_custom_object(
        api.GROUP, api.VERSION, ns, api.PLURAL, body, **kwargs)


# (id, spec or (name, spec), the field the error must name)
INVALID: list[tuple[str, Any, str]] = [
    ("replicas-zero", {"replicas": 0}, "spec.replicas"),
    ("replicas-too-many", {"replicas": 1000}, "spec.replicas"),
    ("replicas-string", {"replicas": "two"}, "spec.replicas"),
    ("procs-zero", {"processesPerReplica": 0}, "spec.processesPerReplica"),
    ("epochs-zero", {"epochs": 0}, "spec.epochs"),
    ("batch-size-negative", {"batchSize": -8}, "spec.batchSize"),
    ("lr-zero", {"learningRate": 0}, "spec.learningRate"),
    ("mixed-precision-fp8", {"mixedPrecision": "fp8"}, "spec.mixedPrecision"),
    ("seed-negative", {"seed": -1}, "spec.seed"),
    ("model-uppercase", {"model": "ResNet50D"}, "spec.model"),
    ("weights-relative", {"weights": "w.safetensors"}, "spec.weights"),
    ("weights-without-pretrained", {"weights": "/w.safetensors", "pretrained": False}, "spec.weights"),
    ("weights-and-cache", {"weights": "/w.safetensors",
                           "pretrainedCache": {"persistentVolumeClaim": {"claimName": "hub"}}},
     "spec.pretrainedCache"),
    ("image-size-tiny", {"imageSize": 8}, "spec.imageSize"),
    ("dataset-two-sources", {"dataset": {"synthetic": {}, "hostPath": {"path": "/srv/pets"}}},
     "spec.dataset"),
    ("dataset-none", {"dataset": {}}, "spec.dataset"),
    ("dataset-pvc-no-claim", {"dataset": {"persistentVolumeClaim": {"path": "/x"}}},
     "spec.dataset.persistentVolumeClaim.claimName"),
    ("dataset-hostpath-relative", {"dataset": {"hostPath": {"path": "pets"}}}, "spec.dataset.hostPath.path"),
    ("output-two-volumes", {"output": {"emptyDir": {}, "persistentVolumeClaim": {"claimName": "o"}}},
     "spec.output"),
    ("output-readonly-claim", {"output": {"persistentVolumeClaim": {"claimName": "o", "readOnly": True}}},
     "spec.output.persistentVolumeClaim.readOnly"),
    ("pull-policy", {"imagePullPolicy": "Sometimes"}, "spec.imagePullPolicy"),
    ("image-with-space", {"image": "my image"}, "spec.image"),
    ("cpu-garbage", {"resources": {"cpu": "lots"}}, "spec.resources.cpu"),
    ("gpu-negative", {"resources": {"gpu": -1}}, "spec.resources.gpu"),
    ("procs-more-than-gpus", {"processesPerReplica": 4, "resources": {"gpu": 2}}, "spec.processesPerReplica"),
    ("toleration-operator", {"tolerations": [{"key": "k", "operator": "Maybe"}]},
     "spec.tolerations[0].operator"),
    ("priority-class-caps", {"priorityClassName": "High"}, "spec.priorityClassName"),
    ("env-reserved", {"env": [{"name": "PETS_MAIN_ADDR", "value": "x"}]}, "spec.env[0]"),
    ("env-bad-name", {"env": [{"name": "1X", "value": "x"}]}, "spec.env[0].name"),
    ("backend-unknown", {"backend": "mpi"}, "spec.backend"),
    ("master-port-low", {"masterPort": 80}, "spec.masterPort"),
    ("master-port-metrics", {"masterPort": 9090}, "spec.masterPort"),
    ("max-restarts-negative", {"maxRestarts": -1}, "spec.maxRestarts"),
    ("deadline-zero", {"activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds"),
    ("ttl-negative", {"ttlSecondsAfterFinished": -5}, "spec.ttlSecondsAfterFinished"),
    ("suspend-string", {"suspend": "yes"}, "spec.suspend"),
    ("unknown-field", {"replica": 2}, "spec.replica"),
    ("name-starts-with-digit", ("9lives", {}), "metadata.name"),
    ("name-too-long", ("p" * 60, {}), "metadata.name"),
]


@pytest.mark.parametrize(("case", "spec", "field"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_spec_is_rejected_naming_the_field(admin: client.ApiClient, crd: dict[str, Any],
                                                    namespace: str, case: str, spec: Any, field: str) -> None:
    name, spec = spec if isinstance(spec, tuple) else (f"bad-{case}"[:40], spec)
    body = training(name, **spec)
    with pytest.raises(ApiException) as err:
        create(admin, namespace, body)
    exc = err.value
    message = json.loads(exc.body).get("message", exc.body) if exc.body else str(exc)
    # Strict field validation reports unknown fields as 400 BadRequest; the schema and CEL as 422.
    assert exc.status in (400, 422), f"{case}: HTTP {exc.status}: {message}"
    assert field in message, f"{case}: the message does not name {field}: {message}"


def test_at_least_twenty_invalid_cases() -> None:
    assert len(INVALID) >= 20


def test_kubectl_apply_refuses_a_bad_spec_with_the_field(crd: dict[str, Any], namespace: str,
                                                         kubeconfig: str) -> None:
    bad = yaml.safe_dump(training("pets", replicas=0, dataset={"synthetic": {}, "hostPath": {"path": "/p"}}))
    res = subprocess.run([tool("kubectl"), "--kubeconfig", kubeconfig, "apply", "-n", namespace, "-f", "-"],
                         input=bad, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode != 0
    assert "spec.replicas" in res.stderr and "spec.dataset" in res.stderr, res.stderr


def test_defaults_are_applied_by_the_server(admin: client.ApiClient, crd: dict[str, Any],
                                            namespace: str) -> None:
    got = create(admin, namespace, training("defaults"))
    spec = got["spec"]
    assert spec == api.stored_spec({}), \
        "server defaults differ from api.resolve_spec (render would lie)"


def test_samples_are_accepted_by_the_server(admin: client.ApiClient, crd: dict[str, Any],
                                            namespace: str) -> None:
    for path in [REPO / "petstraining.yaml", *sorted((REPO / "examples").glob("*.yaml"))]:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc["kind"] == api.KIND:
                got = create(admin, namespace, doc, dry_run="All")
                assert got["spec"] == api.stored_spec(doc["spec"]), path


def _set_status(admin: client.ApiClient, ns: str, name: str, **fields: Any) -> None:
    client.CustomObjectsApi(admin).patch_namespaced_custom_object_status(
        api.GROUP, api.VERSION, ns, api.PLURAL, name, {"status": fields})


def _patch(admin: client.ApiClient, ns: str, name: str, spec: dict[str, Any]) -> Any:
    return client.CustomObjectsApi(admin).patch_namespaced_custom_object(
        api.GROUP, api.VERSION, ns, api.PLURAL, name, {"spec": spec})


@pytest.mark.parametrize("field", ["processesPerReplica", "epochs", "dataset", "image", "backend",
                                   "resources"])
@pytest.mark.usefixtures("operator_paused")
def test_fields_are_immutable_while_the_workload_runs(admin: client.ApiClient, crd: dict[str, Any],
                                                      namespace: str, field: str) -> None:
    create(admin, namespace, training("running", replicas=2))
    change = {"processesPerReplica": 2, "epochs": 9, "dataset": {"synthetic": {"imagesPerClass": 3}},
              "image": "other:1", "backend": "job", "resources": {"cpu": "2"}}[field]
    # Keyed on the workload, not the phase: a Pending training whose Job exists is running already.
    _set_status(admin, namespace, "running", phase=api.PENDING, workloadActive=True)
    with pytest.raises(ApiException) as err:
        _patch(admin, namespace, "running", {field: change})
    assert err.value.status == 422 and f"spec.{field} is immutable while the training's workload runs" \
        in err.value.body
    # Suspend, maxRestarts, the TTL and the scheduling bounds stay editable while it runs, and replicas
    # (a resize: the operator drains the gang and starts it at the new size) ...
    assert _patch(admin, namespace, "running", {"replicas": 3})["spec"]["replicas"] == 3
    _patch(admin, namespace, "running", {"suspend": True, "maxRestarts": 5, "ttlSecondsAfterFinished": 60,
                                         "scheduling": {"stallTimeoutSeconds": 600}})
    # ... and everything is editable once the workload is suspended (the operator rebuilds it on resume).
    _set_status(admin, namespace, "running", phase=api.SUSPENDED, workloadActive=False)
    got = _patch(admin, namespace, "running", {field: change})["spec"][field]
    assert got == api.resolve_spec({field: change}).to_dict()[field]


def _children(spec: dict[str, Any], ns: str, backend: str) -> list[dict[str, Any]]:
    target = builders.Target("dry", ns, attempt=1)
    return backends.get(backend).children(api.resolve_spec(spec), target)


BUILD_CASES = {
    "defaults": {},
    "sample": yaml.safe_load((REPO / "petstraining.yaml").read_text())["spec"],
    "gpu": [d for d in yaml.safe_load_all((REPO / "examples" / "gpu-nodes.yaml").read_text())][0]["spec"],
    "pvc": [d for d in yaml.safe_load_all((REPO / "examples" / "pvc-dataset.yaml").read_text())
            if d["kind"] == api.KIND][0]["spec"],
    "hostpath-suspended": {"dataset": {"hostPath": {"path": "/srv/pets"}}, "suspend": True,
                           "activeDeadlineSeconds": 60, "env": [{"name": "A", "value": "b"}]},
    # an init container fetches the data into a cache claim (with the S3 keys from a Secret)
    "s3-dataset": {"replicas": 2, "dataset": {"url": "s3://pets/v1", "layout": "imagefolder", "s3": {
        "endpoint": "http://s3.pets-s3.svc:7070", "region": "eu-west-1", "credentialsSecret": "s3-keys"},
        "cache": {"size": "2Gi"}}},
    "http-dataset": {"dataset": {"url": "https://example.com/pets.tar.gz", "sha256": "ab" * 32}},
}


@pytest.mark.parametrize("case", sorted(BUILD_CASES))
def test_built_manifests_pass_server_side_dry_run(admin: client.ApiClient, namespace: str, case: str) -> None:
    kinds = []
    for manifest in _children(BUILD_CASES[case], namespace, "job"):
        manifest = copy.deepcopy(manifest)
        # Strict: a field the server does not know (a typo, a misplaced key) is an error, not dropped.
        if manifest["kind"] == "Service":
            got = client.CoreV1Api(admin).create_namespaced_service(namespace, manifest, dry_run="All",
                                                                   field_validation="Strict")
        elif manifest["kind"] == "PersistentVolumeClaim":  # the default output: a claim the operator makes
            got = client.CoreV1Api(admin).create_namespaced_persistent_volume_claim(
                namespace, manifest, dry_run="All", field_validation="Strict")
        elif manifest["kind"] == "NetworkPolicy":
            got = client.NetworkingV1Api(admin).create_namespaced_network_policy(
                namespace, manifest, dry_run="All", field_validation="Strict")
        else:
            got = client.BatchV1Api(admin).create_namespaced_job(namespace, manifest, dry_run="All",
                                                                field_validation="Strict")
            # the pod contract as the server keeps it: PETS_GPUS on a pod given GPUs, and only there
            env = {e.name: e.value for e in got.spec.template.spec.containers[0].env}
            gpus = api.resolve_spec(BUILD_CASES[case]).resources["gpu"]
            assert env.get("PETS_GPUS") == (str(gpus) if gpus else None), (case, env)
        assert got.metadata.name == manifest["metadata"]["name"]
        kinds.append(manifest["kind"])
    output = api.output_of(api.resolve_spec(BUILD_CASES[case]))
    claim = ["PersistentVolumeClaim"] if "managedClaim" in output else []
    cache = ["PersistentVolumeClaim"] if "url" in api.resolve_spec(BUILD_CASES[case]).dataset else []
    assert sorted(kinds) == sorted(["Job", "Service", "NetworkPolicy", *claim, *cache]), kinds


@pytest.mark.parametrize("case", sorted(BUILD_CASES))
def test_pytorchjob_is_accepted_by_the_real_crd(admin: client.ApiClient, pytorchjob_crd: str, namespace: str,
                                                case: str) -> None:
    (pj,) = [m for m in _children(BUILD_CASES[case], namespace, "pytorchjob") if m["kind"] == "PyTorchJob"]
    got = client.CustomObjectsApi(admin).create_namespaced_custom_object(
        "kubeflow.org", "v1", namespace, "pytorchjobs", pj, dry_run="All", field_validation="Strict")
    # The real CRD's structural schema prunes unknown fields: nothing we set may vanish.
    assert got["spec"] == pj["spec"], "the PyTorchJob CRD pruned or changed fields we set"


def test_crd_file_matches_what_the_server_stores(admin: client.ApiClient, crd: dict[str, Any]) -> None:
    stored = client.ApiextensionsV1Api(admin).read_custom_resource_definition(api.CRD_NAME)
    version = stored.spec.versions[0]
    assert [c.name for c in version.additional_printer_columns] == [
        c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert stored.spec.names.short_names == ["pt"]


@pytest.mark.usefixtures("operator_paused")
def test_kubectl_get_pt_shows_the_columns(admin: client.ApiClient, crd: dict[str, Any], namespace: str,
                                          kubeconfig: str) -> None:
    create(admin, namespace, training("cols", replicas=2))
    client.CustomObjectsApi(admin).patch_namespaced_custom_object_status(
        api.GROUP, api.VERSION, namespace, api.PLURAL, "cols",
        {"status": {"phase": "Running", "progress": "2/5", "evalAccuracy": 0.875, "replicas": 1}})
    out = sh(tool("kubectl"), "--kubeconfig", kubeconfig, "get", "pt", "-n", namespace)
    header, row = out.strip().splitlines()
    assert header.split() == ["NAME", "PHASE", "REPLICAS", "DESIRED", "EPOCH", "ACCURACY", "AGE"]
    assert row.split()[:6] == ["cols", "Running", "1", "2", "2/5", "0.875"]  # runs at 1, asked for 2
