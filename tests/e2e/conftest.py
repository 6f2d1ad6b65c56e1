"""Fixtures for tests that run pods on a real cluster (tests/cluster/cluster.sh up local|kind).

The cluster comes from $KUBECONFIG, else $PETS_STATE/kubeconfig (what `cluster.sh up local`
writes). A missing or unreachable cluster fails the test loudly, with the command that fixes it;
it never skips.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from polling import wait_for
from trainings import (  # tests/e2e/trainings.py: the helpers the suites share
    OPERATOR_NAMESPACE,
    RELEASE,
    REPO,
    Trainings,
    cache_dir,
    cluster_kubeconfig,
    helm_binary,
    kubectl,
    on_control_plane,
    tenant_namespace,
)

CLUSTER_DIR = REPO / "tests" / "cluster"
SMOKE_IMAGE = "localhost/pets-training/smoke:bookworm"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test that fails on a cluster keeps its evidence (evidence.py) before its fixtures delete the
    namespaces and the release; the summary shows in the failure's report."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and report.when in ("setup", "call") and cluster_kubeconfig().is_file():
        import evidence

        try:
            report.sections.append(("evidence", evidence.keep(item.nodeid)))
        except Exception as exc:  # the test's own failure is what matters; say why there is no evidence
            report.sections.append(("evidence", f"keeping the evidence failed: {exc!r}"))


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


# ----------------------------------------------------------------------------- the chart and trainings
# (the helpers they use live in tests/e2e/trainings.py)


def _guardrails_these_tests_need() -> list[str]:
    """Helm flags: the chart's guardrails (docs/guardrails.md) opened exactly as far as these tests go.
    hostPath datasets: /srv/pets (test_training.py's pod-security row) and the state root's volumes/
    (its empty_host_dir); images: the missing one of the image row and test_hostile_pods.py's; the
    ServiceAccount of the service-account row (which does not exist: the pods are refused)."""
    volumes = Path(os.environ.get("PETS_STATE", "/tmp/pets-training-cluster")) / "volumes"
    return ["--set-json", f'guardrails.hostPathPrefixes=["/srv/pets", "{volumes}"]',
            "--set-json", 'guardrails.imagePrefixes=["pets-training/trainer", "localhost/nope/trainer", '
                          '"pets-training/hostile"]',
            "--set-json", 'guardrails.serviceAccountNames=["nope"]']


# The Prometheus add-on's namespace (tests/cluster/prometheus_manifests.py): admitted to the trainers'
# progress port as docs/watching.md tells users to admit theirs, so test_dashboard.py can scrape rank 0.
PROMETHEUS_NAMESPACE = "pets-prometheus"


def _prometheus_may_scrape_the_trainers() -> list[str]:
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": PROMETHEUS_NAMESPACE}}}
    return ["--set-json", f"trainingNetworkPolicy.metricsFrom={json.dumps([peer])}"]


def _install_release(kube_api: Any, env: dict[str, str]) -> None:
    # Helm installs crds/ only on a first install and never upgrades them: a cluster kept from an
    # earlier run would test today's operator against yesterday's schema (unknown fields pruned).
    # Apply the CRD the way docs/chart.md tells users to when they upgrade.
    crds = REPO / "charts" / "pets-training" / "crds"
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
    subprocess.run([helm_binary(), "upgrade", "--install", RELEASE, str(REPO / "charts" / "pets-training"),
                    "--namespace", OPERATOR_NAMESPACE, "--create-namespace",
                    "--set", "image.pullPolicy=IfNotPresent", *_guardrails_these_tests_need(),
                    *_prometheus_may_scrape_the_trainers(),
                    *on_control_plane(kube_api),
                    "--wait", "--timeout", "5m"],
                   env=env, check=True)


@contextlib.contextmanager
def _release_users(shared_dir: Path) -> Iterator[int]:
    """The count of pytest processes using the release (tests/e2e/run.sh runs two with pytest-xdist),
    held under a lock: the first one in installs it, the last one out uninstalls it."""
    with open(shared_dir / "operator-release.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            lock.seek(0)
            yield int(lock.read().strip() or 0)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _set_release_users(shared_dir: Path, users: int) -> None:
    (shared_dir / "operator-release.lock").write_text(str(users))


@pytest.fixture(scope="session")
def operator_release(kube_api: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The chart installed with helm, its operator Deployment rolled out; uninstalled after the last test
    that uses it, in this process or in the other pytest-xdist worker."""
    env = {**os.environ, "KUBECONFIG": str(cluster_kubeconfig())}
    # One directory for every worker of this run (pytest-xdist gives each its own basetemp under it).
    shared_dir = tmp_path_factory.getbasetemp().parent if os.environ.get("PYTEST_XDIST_WORKER") \
        else tmp_path_factory.getbasetemp()
    with _release_users(shared_dir) as users:
        if users == 0:
            _install_release(kube_api, env)
        _set_release_users(shared_dir, users + 1)
    yield RELEASE
    with _release_users(shared_dir) as users:
        _set_release_users(shared_dir, users - 1)
        if users == 1:
            subprocess.run([helm_binary(), "uninstall", RELEASE, "--namespace", OPERATOR_NAMESPACE, "--wait"],
                           env=env, check=False)


@pytest.fixture
def trainings(kube_api: Any, operator_release: str) -> Iterator[Trainings]:
    with tenant_namespace(kube_api, "e2e") as tenant:
        yield tenant


@pytest.fixture
def other_tenant(kube_api: Any, operator_release: str) -> Iterator[Trainings]:
    """A second tenant's namespace, beside `trainings`'."""
    with tenant_namespace(kube_api, "e2e-other") as tenant:
        yield tenant


SHARED_CLASS = "pets-shared"  # the local cluster's shared StorageClass (tests/cluster/storage.sh)


def shared_volume(trainings: Trainings, claim: str) -> Path:
    """A ReadWriteMany claim of the cluster's shared StorageClass, bound; returns its directory on this
    machine (every node of the local cluster sees it), so a test can fill it or read it. The volume
    and its directory go when the test's namespace does (reclaimPolicy Delete)."""
    from kubernetes import client

    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
           "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": SHARED_CLASS,
                    "resources": {"requests": {"storage": "2Gi"}}}}
    kubectl("-n", trainings.namespace, "apply", "-f", "-", input_text=yaml.safe_dump(pvc))
    core = client.CoreV1Api(trainings.core.api_client)
    volume = wait_for(f"claim {trainings.namespace}/{claim} Bound (StorageClass {SHARED_CLASS}: "
                      "tests/cluster/storage.sh status)",
                      lambda: (c := core.read_namespaced_persistent_volume_claim(claim, trainings.namespace))
                      .status.phase == "Bound" and c.spec.volume_name, 120, 1)
    return Path(core.read_persistent_volume(volume).spec.host_path.path)


@pytest.fixture
def shared_claim(kube_api: Any, trainings: Trainings) -> Callable[[str], Path]:
    """`shared_volume` for the test's namespace: a claim name -> its directory on this machine."""
    return lambda claim: shared_volume(trainings, claim)


@pytest.fixture
def shared_output(kube_api: Any, trainings: Trainings) -> str:
    """A ReadWriteMany claim on the shared storage: checkpoints outlive the pods."""
    claim = "pets-output"
    shared_volume(trainings, claim)  # mode 0777: the trainer (uid 65532) writes there
    return claim


@pytest.fixture
def hub_cache(kube_api: Any, trainings: Trainings) -> str:
    """A claim holding a Hugging Face hub cache with timm's resnet50d weights, in the exact layout
    `hf download timm/resnet50d.ra2_in1k --cache-dir DIR` leaves (the weights are a seeded random
    init made here: there is no internet to download the real ones)."""
    from pets_training.hubcache import make_hub_cache

    claim = "hub-cache"
    make_hub_cache(shared_volume(trainings, claim), "resnet50d")  # world-readable: read-only as uid 65532
    return claim
