"""addon_manifests.py changes exactly what the local node needs in upstream's add-on manifests.

Upstream's real manifests come from the Go module cache or the prebuilt Kueue folder, which a unit test
does not reach; the documents below have the shape of theirs (training-operator v1.8.1's standalone
overlay, Kueue v0.19.2's config/default). That the adapted manifests run is shown by
`tests/cluster/cluster.sh addon-up kubeflow|kueue`, which waits for the controllers and their webhooks.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import importlib.util
import io
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("addon_manifests", HERE / "addon_manifests.py")
assert _spec and _spec.loader
am = importlib.util.module_from_spec(_spec)
sys.modules["addon_manifests"] = am
_spec.loader.exec_module(am)

PKI = {name: f"-----BEGIN {name}-----\n".encode() for name in am.WEBHOOK_PKI_FILES}
KUEUE_CONFIG = """apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
# a comment upstream keeps
integrations:
  frameworks:
  - "batch/job"
  # - "kubeflow.org/pytorchjob"
  - "pod"
"""


def kubeflow_docs() -> list[dict[str, Any]]:
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kubeflow"}},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "training-operator", "namespace": "kubeflow"},
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "training-operator",
                                "command": ["/manager"],
                                "image": "kubeflow/training-operator:v1-04f9f13",
                            }
                        ]
                    }
                }
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "training-operator-webhook-cert", "namespace": "kubeflow"},
            "type": "Opaque",
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "validator.training-operator.kubeflow.org"},
            "webhooks": [
                {"name": n, "clientConfig": {"service": {"name": "training-operator", "namespace": "x"}}}
                for n in ("validator.pytorchjob.training-operator.kubeflow.org", "validator.tfjob.x")
            ],
        },
    ]


def kueue_docs() -> list[dict[str, Any]]:
    return [
        *(
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": f"{v}.visibility.kueue.x-k8s.io"},
                "spec": {"service": {"name": "kueue-visibility-server", "namespace": "kueue-system"}},
            }
            for v in ("v1beta1", "v1beta2")
        ),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kueue-manager-config", "namespace": "kueue-system"},
            "data": {"controller_manager_config.yaml": KUEUE_CONFIG},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "kueue-controller-manager", "namespace": "kueue-system"},
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "manager",
                                "image": "KUEUE_IMAGE",
                                "imagePullPolicy": "Always",
                                "resources": {
                                    "limits": {"cpu": "2", "memory": "512Mi"},
                                    "requests": {"cpu": "500m", "memory": "512Mi"},
                                },
                            }
                        ]
                    }
                }
            },
        },
    ]


def test_kubeflow_changes_image_args_requests_and_webhook_certs() -> None:
    docs = kubeflow_docs()
    before = copy.deepcopy(docs)
    out = am.kubeflow(docs, "localhost/to:v1", "localhost/init:1", "/etc/t.yaml", PKI)
    c = out[1]["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "localhost/to:v1"
    assert c["imagePullPolicy"] == "Never"
    assert c["command"] == ["/manager"]
    assert c["args"] == [
        "--enable-scheme=pytorchjob",
        "--pytorch-init-container-image=localhost/init:1",
        "--pytorch-init-container-template-file=/etc/t.yaml",
    ]
    assert c["resources"] == {"requests": {"cpu": "10m", "memory": "64Mi"}}
    assert {k: base64.b64decode(v) for k, v in out[2]["data"].items()} == PKI
    bundles = {h["clientConfig"]["caBundle"] for h in out[3]["webhooks"]}
    assert bundles == {base64.b64encode(PKI["ca.crt"]).decode()}
    assert out[0] == before[0]  # the rest is upstream's


def test_kubeflow_fails_loudly_on_an_unknown_layout() -> None:
    docs = kubeflow_docs()
    docs[1]["spec"]["template"]["spec"]["containers"][0]["name"] = "manager"
    with pytest.raises(am.ManifestError, match="no container 'training-operator'"):
        am.kubeflow(docs, "i", "i", "t", PKI)
    with pytest.raises(am.ManifestError, match="expected one Deployment training-operator"):
        am.kubeflow(kubeflow_docs()[2:], "i", "i", "t", PKI)
    with pytest.raises(am.ManifestError, match="lacks"):
        am.kubeflow(kubeflow_docs(), "i", "i", "t", {"ca.crt": b"x"})


def deployment_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return am.find(docs, "Deployment", "kueue-controller-manager", "kueue-system")


def manager(docs: list[dict[str, Any]]) -> dict[str, Any]:
    c: dict[str, Any] = deployment_of(docs)["spec"]["template"]["spec"]["containers"][0]
    return c


def checksum(docs: list[dict[str, Any]]) -> str:
    annotations = deployment_of(docs)["spec"]["template"]["metadata"]["annotations"]
    return str(annotations[am.CONFIG_CHECKSUM_ANNOTATION])


def test_kueue_changes_image_pull_policy_and_cpu_request() -> None:
    out, _ = am.kueue(kueue_docs(), "localhost/kueue:v0.19.2", "50m", [])
    c = manager(out)
    assert (c["image"], c["imagePullPolicy"]) == ("localhost/kueue:v0.19.2", "Never")
    assert c["resources"] == {
        "limits": {"cpu": "2", "memory": "512Mi"},
        "requests": {"cpu": "50m", "memory": "512Mi"},
    }
    config = am.find(out, "ConfigMap", "kueue-manager-config")["data"]["controller_manager_config.yaml"]
    assert config == KUEUE_CONFIG  # untouched, comments too
    assert checksum(out) == hashlib.sha256(KUEUE_CONFIG.encode()).hexdigest()[:16]


def test_kueue_leaves_out_the_visibility_api_unless_asked() -> None:
    out, dropped = am.kueue(kueue_docs(), "i", "50m", [])
    assert [d["metadata"]["name"] for d in dropped] == [
        "v1beta1.visibility.kueue.x-k8s.io",
        "v1beta2.visibility.kueue.x-k8s.io",
    ]
    assert not [d for d in out if d["kind"] == "APIService"]
    assert manager(out)["args"] == ["--feature-gates=VisibilityOnDemand=false"]
    docs = kueue_docs()
    manager(docs)["args"] = ["--config=/c.yaml", "--feature-gates=A=true"]
    out, _ = am.kueue(docs, "i", "50m", [])
    assert manager(out)["args"] == ["--config=/c.yaml", "--feature-gates=A=true,VisibilityOnDemand=false"]
    kept, dropped = am.kueue(kueue_docs(), "i", "50m", [], visibility_api=True)
    assert len([d for d in kept if d["kind"] == "APIService"]) == 2 and dropped == []
    assert "args" not in manager(kept)


def test_kueue_enables_a_framework_once() -> None:
    out, _ = am.kueue(kueue_docs(), "i", "50m", ["kubeflow.org/pytorchjob", "batch/job"])
    assert am.frameworks_of(out) == ["batch/job", "pod", "kubeflow.org/pytorchjob"]
    config = yaml.safe_load(
        am.find(out, "ConfigMap", "kueue-manager-config")["data"]["controller_manager_config.yaml"]
    )
    assert config["kind"] == "Configuration"
    assert am.kueue(kueue_docs(), "i", "50m", ["kubeflow.org/pytorchjob"])[0] == out
    default, _ = am.kueue(kueue_docs(), "i", "50m", [])
    assert checksum(default) != checksum(out)  # another config rolls the Deployment


def test_cli_round_trip(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(yaml.safe_dump_all(kueue_docs())))
    dropped = tmp_path / "dropped.yaml"
    argv = ["kueue", "--image", "i", "--framework", "kubeflow.org/pytorchjob", "--dropped", str(dropped)]
    assert am.main(argv) == 0
    out = capsys.readouterr().out
    docs = list(yaml.safe_load_all(out))
    assert am.frameworks_of(docs)[-1] == "kubeflow.org/pytorchjob"
    assert "controller_manager_config.yaml: |" in out  # multi-line text stays readable
    assert [d["kind"] for d in yaml.safe_load_all(dropped.read_text())] == ["APIService", "APIService"]


def test_cli_names_the_problem(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(yaml.safe_dump_all(kueue_docs()[:3])))
    assert am.main(["kueue", "--image", "i"]) == 1
    assert "expected one Deployment kueue-controller-manager" in capsys.readouterr().err


def test_init_container_template_waits_with_getent() -> None:
    """The workers' init container template: Go-template fields filled as the operator fills them."""
    text = (HERE / "pytorch-init-container.yaml").read_text()
    fields = set(re.findall(r"{{\.(\w+)}}", text))
    assert fields == {"InitContainerImage", "MaxTries", "MasterAddr"}
    values = {"InitContainerImage": "localhost/to:v1", "MaxTries": "100", "MasterAddr": "job-master-0"}
    rendered = re.sub(r"{{\.(\w+)}}", lambda m: values[m.group(1)], text)
    [init] = yaml.safe_load(rendered)
    assert init["name"] == "init-pytorch"
    assert init["image"] == "localhost/to:v1"
    script = init["command"][2]
    assert init["command"][:2] == ["sh", "-c"]
    assert "getent hosts job-master-0" in script and "nslookup" not in script
    assert "$(seq 100)" in script
    # Pod Security `restricted` (and checkov's container checks) hold for the worker pods with it too.
    assert init["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "allowPrivilegeEscalation": False,
        "privileged": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"}}


# ------------------------------------------------------------------ S3 (Versity S3 gateway)
def s3_objects(**kw: str) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in am.s3("localhost/pets-training/s3:v1.0.14", **kw)}


def test_s3_objects_and_endpoint() -> None:
    objs = s3_objects()
    assert list(objs) == ["Namespace", "Secret", "Deployment", "Service"]
    assert {d["metadata"].get("namespace", d["metadata"]["name"]) for d in objs.values()} == {"pets-s3"}
    labels = objs["Namespace"]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    svc = objs["Service"]
    assert svc["metadata"]["name"] == "s3" and svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"] == [{"name": "s3", "port": 7070, "targetPort": "s3", "protocol": "TCP"}]
    pod_labels = objs["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert objs["Deployment"]["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert am.S3_ENDPOINT == "http://s3.pets-s3.svc:7070"


def test_s3_credentials_come_from_the_secret() -> None:
    objs = s3_objects()
    data = {k: base64.b64decode(v).decode() for k, v in objs["Secret"]["data"].items()}
    assert data == {
        "AWS_ACCESS_KEY_ID": am.S3_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": am.S3_SECRET_KEY,
        "AWS_ENDPOINT_URL": "http://s3.pets-s3.svc:7070",
        "AWS_REGION": "us-east-1",
    }
    [c] = objs["Deployment"]["spec"]["template"]["spec"]["containers"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"]}
    assert refs == {
        "ROOT_ACCESS_KEY": {"name": "s3-credentials", "key": "AWS_ACCESS_KEY_ID"},
        "ROOT_SECRET_KEY": {"name": "s3-credentials", "key": "AWS_SECRET_ACCESS_KEY"},
    }
    # never on the command line (visible in the pod spec and `ps`)
    assert not [a for a in c["args"] if am.S3_SECRET_KEY in a or a.startswith(("--access", "--secret"))]
    other = s3_objects(access_key="ak", secret_key="sk")
    assert base64.b64decode(other["Secret"]["data"]["AWS_SECRET_ACCESS_KEY"]) == b"sk"
    ann = am.CONFIG_CHECKSUM_ANNOTATION
    annotations = [o["Deployment"]["spec"]["template"]["metadata"]["annotations"][ann] for o in (objs, other)]
    assert annotations[0] != annotations[1]  # other credentials roll the pod
    with pytest.raises(am.ManifestError, match="must not be empty"):
        am.s3("i", access_key="")


def test_s3_deployment_runs_versitygw_posix_on_emptydirs() -> None:
    dep = s3_objects()["Deployment"]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    spec = dep["spec"]["template"]["spec"]
    [c] = spec["containers"]
    assert (c["image"], c["imagePullPolicy"]) == ("localhost/pets-training/s3:v1.0.14", "Never")
    # global options, then the backend and its options, then its directory (versitygw's CLI order)
    assert c["args"] == ["--port=:7070", "--region=us-east-1", "--health=/health",
                         "posix", "--sidecar=/meta", "/data"]
    assert c["ports"] == [{"name": "s3", "containerPort": 7070, "protocol": "TCP"}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "s3"}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts == {"/data": "data", "/meta": "meta"}
    assert spec["volumes"] == [{"name": "data", "emptyDir": {}}, {"name": "meta", "emptyDir": {}}]
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert spec["automountServiceAccountToken"] is False


def test_s3_pod_meets_pod_security_restricted() -> None:
    spec = s3_objects()["Deployment"]["spec"]["template"]["spec"]
    [c] = spec["containers"]
    sc = {**spec["securityContext"], **c["securityContext"]}
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532 and sc["runAsUser"] != 0
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert not spec.get("hostNetwork") and not spec.get("hostPID")
    assert all("hostPath" not in v for v in spec["volumes"])


def test_s3_cli_reads_no_input(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("not: [yaml"))  # never read
    assert am.main(["s3", "--image", "localhost/pets-training/s3:v1.0.14"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["Namespace", "Secret", "Deployment", "Service"]
    assert docs == am.s3("localhost/pets-training/s3:v1.0.14")


def test_s3_harness_repeats_the_add_ons_constants() -> None:
    """s3_harness.py imports without PyYAML, so it repeats the add-on's endpoint and credentials."""
    spec = importlib.util.spec_from_file_location("s3_harness", HERE / "s3_harness.py")
    assert spec and spec.loader
    h = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(h)
    assert (h.S3_ACCESS_KEY, h.S3_SECRET_KEY, h.S3_ENDPOINT, h.S3_REGION) == (
        am.S3_ACCESS_KEY, am.S3_SECRET_KEY, am.S3_ENDPOINT, am.S3_REGION)
