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
