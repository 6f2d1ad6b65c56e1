"""storage.sh renders the manifests of the shared StorageClass `pets-shared` as the local cluster needs them.

No cluster here: `storage.sh render` is plain bash. That the manifests pass the API server's validation,
and that the provisioner binary picks up a claim of the class, creates its helper pod and the PV, was
checked against a private control plane (see docs/cluster.md, "Shared storage"); that the provisioner
runs as a pod is shown by `tests/cluster/storage.sh up` on a live cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit

HERE = Path(__file__).parent
STORAGE_SH = HERE / "storage.sh"
PROVISIONER_IMAGE = "localhost/pets-training/local-path-provisioner:v0.0.30"
HELPER_IMAGE = "localhost/pets-training/smoke:bookworm"


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k not in ("PETS_SHARED_DIR", "LOCAL_PATH_VERSION")}
    full_env.update(env)
    return subprocess.run(
        ["bash", str(STORAGE_SH), *args], env=full_env, capture_output=True, text=True, check=False
    )


def render(**env: str) -> list[dict[str, Any]]:
    res = run("render", **env)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


@pytest.fixture
def docs(tmp_path: Path) -> list[dict[str, Any]]:
    return render(PETS_SHARED_DIR=str(tmp_path / "shared"))


def test_objects_are_upstreams_set(docs: list[dict[str, Any]]) -> None:
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == sorted(
        [
            ("Namespace", "local-path-storage"),
            ("ServiceAccount", "local-path-provisioner-service-account"),
            ("Role", "local-path-provisioner-role"),
            ("ClusterRole", "local-path-provisioner-role"),
            ("RoleBinding", "local-path-provisioner-bind"),
            ("ClusterRoleBinding", "local-path-provisioner-bind"),
            ("Deployment", "local-path-provisioner"),
            ("StorageClass", "pets-shared"),
            ("ConfigMap", "local-path-config"),
        ]
    )
    for d in docs:
        if d["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding", "StorageClass"):
            assert d["metadata"]["namespace"] == "local-path-storage", d["kind"]
        assert d["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "pets-storage"}


def test_storage_class_is_the_shared_default(docs: list[dict[str, Any]]) -> None:
    sc = by_kind(docs, "StorageClass")
    assert sc["provisioner"] == "rancher.io/local-path"
    assert sc["volumeBindingMode"] == "Immediate"
    assert sc["reclaimPolicy"] == "Delete"
    assert sc["metadata"]["annotations"] == {"storageclass.kubernetes.io/is-default-class": "true"}


def test_config_points_at_the_shared_dir(tmp_path: Path, docs: list[dict[str, Any]]) -> None:
    config = json.loads(by_kind(docs, "ConfigMap")["data"]["config.json"])
    # nodePathMap must be empty when sharedFileSystemPath is set (upstream's README).
    assert config == {"nodePathMap": [], "sharedFileSystemPath": str(tmp_path / "shared")}


def test_shared_dir_defaults_under_the_state_dir_and_is_made_absolute(tmp_path: Path) -> None:
    cm = by_kind(render(PETS_STATE=str(tmp_path / "state")), "ConfigMap")
    assert json.loads(cm["data"]["config.json"])["sharedFileSystemPath"] == str(tmp_path / "state" / "shared")
    cm = by_kind(render(PETS_SHARED_DIR=f"{tmp_path}/a/../b/"), "ConfigMap")
    assert json.loads(cm["data"]["config.json"])["sharedFileSystemPath"] == str(tmp_path / "b")


@pytest.mark.parametrize("bad", ["/", '/tmp/a"b', "/tmp/a b", "/tmp/a\\b"])
def test_unusable_shared_dirs_are_refused(bad: str) -> None:
    res = run("render", PETS_SHARED_DIR=bad)
    assert res.returncode != 0
    assert "PETS_SHARED_DIR" in res.stderr
    assert res.stdout == ""


def test_provisioner_deployment(docs: list[dict[str, Any]]) -> None:
    dep = by_kind(docs, "Deployment")
    spec = dep["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}  # no leader election: never two at once
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "local-path-provisioner-service-account"
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["image"] == PROVISIONER_IMAGE
    assert c["imagePullPolicy"] == "Never"
    assert c["command"][:5] == [
        "local-path-provisioner",
        "--debug",
        "start",
        "--config",
        "/etc/config/config.json",
    ]
    assert c["resources"]["requests"] == {"cpu": "10m", "memory": "32Mi"}
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["CONFIG_MOUNT_PATH"]["value"] == "/etc/config/"
    assert c["volumeMounts"] == [{"name": "config-volume", "mountPath": "/etc/config/"}]
    assert pod["volumes"] == [{"name": "config-volume", "configMap": {"name": "local-path-config"}}]


def test_a_new_shared_dir_rolls_the_provisioner(tmp_path: Path) -> None:
    def sha(path: Path) -> str:
        dep = by_kind(render(PETS_SHARED_DIR=str(path)), "Deployment")
        return dep["spec"]["template"]["metadata"]["annotations"]["pets-training/config-sha256"]

    assert sha(tmp_path / "a") == sha(tmp_path / "a")
    assert sha(tmp_path / "a") != sha(tmp_path / "b")


def test_helper_pod_uses_the_smoke_image_as_root(docs: list[dict[str, Any]]) -> None:
    helper = yaml.safe_load(by_kind(docs, "ConfigMap")["data"]["helperPod.yaml"])
    assert helper["kind"] == "Pod"
    (c,) = helper["spec"]["containers"]
    assert c["name"] == "helper-pod"  # the provisioner reads the helper's logs from this container
    assert c["image"] == HELPER_IMAGE
    assert c["imagePullPolicy"] == "Never"
    # the smoke image runs as nobody; the helper makes directories in the root-owned shared dir
    assert helper["spec"]["securityContext"] == {"runAsUser": 0, "runAsGroup": 0}


@pytest.mark.skipif(shutil.which("sh") is None, reason="no sh")
def test_setup_and_teardown_scripts(tmp_path: Path, docs: list[dict[str, Any]]) -> None:
    data = by_kind(docs, "ConfigMap")["data"]
    vol = tmp_path / "shared" / "pvc-1_ns_claim"
    env = {**os.environ, "VOL_DIR": str(vol), "VOL_MODE": "Filesystem", "VOL_SIZE_BYTES": "1"}
    old_umask = os.umask(0o022)
    try:
        subprocess.run(["sh", "-c", data["setup"]], env=env, check=True)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(vol.stat().st_mode) == 0o777  # any pod uid may write results
    (vol / "result.json").write_text("{}")
    subprocess.run(["sh", "-c", data["teardown"]], env=env, check=True)
    assert not vol.exists()


def test_archives_names_the_two_images_every_node_needs(tmp_path: Path) -> None:
    res = run("archives", PETS_CACHE=str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [
        str(tmp_path / "images" / "local-path-provisioner.tar"),
        str(tmp_path / "images" / "smoke.tar"),
    ]


def _upstream_manifest() -> Path:
    """Upstream's deploy/local-path-storage.yaml from its module (downloaded from the Go module proxy
    if not cached yet: a zip, no build)."""
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod", "GOWORK": "off"}
    res = subprocess.run(["go", "mod", "download", "-json",
                          "github.com/rancher/local-path-provisioner@v0.0.30"],
                         capture_output=True, text=True, check=False, env=env, cwd="/")
    assert res.returncode == 0, f"go mod download failed: {res.stdout}{res.stderr}"
    return Path(json.loads(res.stdout)["Dir"]) / "deploy" / "local-path-storage.yaml"


def test_rbac_and_scripts_match_upstream(docs: list[dict[str, Any]]) -> None:
    path = _upstream_manifest()
    upstream = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for kind in ("Role", "ClusterRole"):
        assert by_kind(docs, kind)["rules"] == by_kind(upstream, kind)["rules"], kind
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        ours, theirs = by_kind(docs, kind), by_kind(upstream, kind)
        assert (ours["roleRef"], ours["subjects"]) == (theirs["roleRef"], theirs["subjects"]), kind
    ours_cm, theirs_cm = by_kind(docs, "ConfigMap")["data"], by_kind(upstream, "ConfigMap")["data"]
    assert (ours_cm["setup"], ours_cm["teardown"]) == (theirs_cm["setup"], theirs_cm["teardown"])
    theirs_c = by_kind(upstream, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    ours_c = by_kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert ours_c["command"][: len(theirs_c["command"])] == theirs_c["command"]
    assert ours_c["env"] == theirs_c["env"]
