"""Fixtures for tests that run pods on a real cluster (tests/cluster/cluster.sh up local|kind).

The cluster comes from $KUBECONFIG, else $PETS_STATE/kubeconfig (what `cluster.sh up local`
writes). A missing or unreachable cluster fails the test loudly, with the command that fixes it;
it never skips.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLUSTER_DIR = REPO / "tests" / "cluster"
SMOKE_IMAGE = "localhost/pets-training/smoke:bookworm"


def cache_dir() -> Path:
    return Path(os.environ.get("PETS_CACHE", Path.home() / ".cache" / "pets-training"))


def cluster_kubeconfig() -> Path:
    """$KUBECONFIG if set, else the local cluster's admin kubeconfig."""
    if os.environ.get("KUBECONFIG"):
        return Path(os.environ["KUBECONFIG"])
    return Path(os.environ.get("PETS_STATE", "/tmp/pets-training-cluster")) / "kubeconfig"


@pytest.fixture(scope="session")
def kube_api():  # type: ignore[no-untyped-def]
    """A kubernetes ApiClient for the cluster; fails (never skips) when there is none."""
    from kubernetes import client, config

    path = cluster_kubeconfig()
    if not path.is_file():
        pytest.fail(f"no kubeconfig at {path}: start a cluster with `make cluster-up` (or set KUBECONFIG)")
    api = config.new_client_from_config(config_file=str(path))
    try:
        nodes = client.CoreV1Api(api).list_node(_request_timeout=10).items
    except Exception as exc:  # any transport or API error means: no usable cluster
        pytest.fail(f"cluster from {path} is not reachable ({exc}); run `make cluster-up`")
    if not nodes:
        pytest.fail(f"cluster from {path} has no nodes: pods cannot run; run `make cluster-up`")
    return api


@pytest.fixture
def namespace(kube_api) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A fresh namespace for one test, deleted afterwards (its pods go with it)."""
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    name = f"smoke-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        # Pods are admitted only once the namespace's "default" ServiceAccount exists.
        deadline = time.monotonic() + 60
        while not core.list_namespaced_service_account(name, field_selector="metadata.name=default").items:
            if time.monotonic() > deadline:
                pytest.fail(f"namespace {name}: no 'default' ServiceAccount after 60 s (controller-manager?)")
            time.sleep(0.5)
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="session")
def smoke_image(kube_api) -> str:  # type: ignore[no-untyped-def]
    """The smoke tests' image (Debian minbase + python3), built once and loaded into the node.

    Built by tests/cluster/build.sh (debootstrap, cached under $PETS_CACHE/images) and imported
    with tests/cluster/load-image.sh, so no registry is needed (on kind, PETS_CLUSTER=kind, it
    goes in with `kind load image-archive`).
    """
    subprocess.run([str(CLUSTER_DIR / "build.sh"), "smoke-image"], check=True)
    archive = cache_dir() / "images" / "smoke.tar"
    # load-image.sh imports into the local node's containerd, or (PETS_CLUSTER=kind) into kind's.
    subprocess.run([str(CLUSTER_DIR / "load-image.sh"), "--archive", str(archive)], check=True)
    return SMOKE_IMAGE
