"""What the e2e suites share: the cluster's PetsTrainings through the real API server, kubectl, helm."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from polling import wait_for

REPO = Path(__file__).resolve().parents[2]


# Small enough to train in a couple of minutes on two CPU pods of one 2-core node.
SMALL_SPEC: dict[str, Any] = {
    "replicas": 2,
    "processesPerReplica": 1,
    "epochs": 2,
    "batchSize": 16,
    "imageSize": 64,
    "model": "resnet18",
    "pretrained": False,  # no internet here: random init (the default, pretrained, needs the hub or a cache)
    "dataset": {"synthetic": {"numClasses": 4, "imagesPerClass": 24}},
    "resources": {"cpu": "800m", "memory": "2Gi"},
    "maxRestarts": 2,
}


def cpu_runs_bf16() -> bool:
    """The trainer's own answer (torch's check): its default precision trains in bf16 on such a CPU."""
    from pets_training.model import cpu_runs_bf16_natively

    return cpu_runs_bf16_natively()


# 640 training images an epoch, of a size that makes an epoch last about as long on either kind of 2-core
# machine CI runs on, under the operator's 10 s progress poll: 128 px where the CPU has bf16 instructions
# (about 4 s), 64 px where the trainer runs fp32 (128 px took 3-4x as long there). A test that must act
# mid-run (a crash, an eviction, a lost node) asks for enough epochs to outlast the poll and its fault.
LONGER_SPEC: dict[str, Any] = {**SMALL_SPEC, "imageSize": 128 if cpu_runs_bf16() else 64,
                               "dataset": {"synthetic": {"numClasses": 4, "imagesPerClass": 200}}}


def cache_dir() -> Path:
    return Path(os.environ.get("PETS_CACHE", Path.home() / ".cache" / "pets-training"))


def cluster_kubeconfig() -> Path:
    """$KUBECONFIG if set, else the local cluster's admin kubeconfig."""
    if os.environ.get("KUBECONFIG"):
        return Path(os.environ["KUBECONFIG"])
    return Path(os.environ.get("PETS_STATE", "/tmp/pets-training-cluster")) / "kubeconfig"

GROUP, VERSION, PLURAL = "training.pets.dev", "v1alpha1", "petstrainings"
RELEASE = "pets"
OPERATOR_NAMESPACE = os.environ.get("PETS_E2E_OPERATOR_NAMESPACE", "pets-system")
TRAIN_TIMEOUT_S = int(os.environ.get("PETS_E2E_TRAIN_TIMEOUT", "900"))

def kubectl(*args: str, check: bool = True,
            input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(cluster_kubeconfig())}
    return subprocess.run(["kubectl", *args], env=env, text=True, capture_output=True,
                          input=input_text, check=check)


def helm_binary() -> str:
    candidate = cache_dir() / "bin" / "helm"
    return str(candidate) if candidate.is_file() else "helm"


POLL_S = 2.0  # the cluster's API and kubectl, polled on a 2-core machine that also trains


class Trainings:
    """The PetsTrainings of one namespace, through the real API server."""

    def __init__(self, api: Any, namespace: str) -> None:
        from kubernetes import client

        self.namespace = namespace
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)

    def create(self, name: str, spec: dict[str, Any], labels: dict[str, str] | None = None) -> None:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PetsTraining",
                "metadata": {"name": name, "labels": labels or {}}, "spec": spec}
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)

    def get(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def status(self, name: str) -> dict[str, Any]:
        return self.get(name).get("status") or {}

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name,
                                                   {"spec": spec})

    def status_unless_failed(self, name: str) -> dict[str, Any]:
        """The status; a training that Failed fails the test at once, as a wait for anything else is over."""
        status = self.status(name)
        if status.get("phase") == "Failed":
            pytest.fail(f"{self.namespace}/{name} Failed: {json.dumps(status, indent=1)}\n"
                        f"{self.describe(name)}")
        return status

    def wait_phase(self, name: str, phase: str, timeout_s: float = TRAIN_TIMEOUT_S) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            status = self.status(name) if phase == "Failed" else self.status_unless_failed(name)
            return status if status.get("phase") == phase else None
        return wait_for(f"{self.namespace}/{name} phase {phase}", probe, timeout_s, POLL_S)

    def wait_epoch(self, name: str, epoch: int, timeout_s: float = TRAIN_TIMEOUT_S) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            status = self.status_unless_failed(name)
            return status if (status.get("epoch") or 0) >= epoch else None
        return wait_for(f"{self.namespace}/{name} status.epoch >= {epoch}", probe, timeout_s, POLL_S)

    def jobs(self, name: str) -> list[Any]:
        return self.batch.list_namespaced_job(
            self.namespace, label_selector=f"{GROUP}/training={name}").items

    def pods(self, name: str) -> list[Any]:
        return self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{GROUP}/training={name}").items

    def evict(self, pod: Any) -> None:
        """Evict `pod` through the Eviction API, as a node drain or a Kueue preemption does."""
        from kubernetes import client

        eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod.metadata.name,
                                                                  namespace=self.namespace))
        self.core.create_namespaced_pod_eviction(pod.metadata.name, self.namespace, eviction)

    def describe(self, name: str) -> str:
        """What a person would look at when a test fails: the objects and the pods' logs."""
        out = [kubectl("-n", self.namespace, "get", "pt,job,svc,pod", "-o", "wide", check=False).stdout,
               kubectl("-n", self.namespace, "get", "events", "--sort-by=.lastTimestamp",
                       check=False).stdout[-4000:]]
        for pod in self.pods(name):
            logs = kubectl("-n", self.namespace, "logs", pod.metadata.name, "--tail=40", check=False)
            out.append(f"--- {pod.metadata.name}\n{logs.stdout}{logs.stderr}")
        return "\n".join(out)


# The role and taint of a dedicated control-plane node (make cluster-up NODES=3, kind, kubeadm).
CONTROL_PLANE_ROLE = "node-role.kubernetes.io/control-plane"


def dedicated_control_plane(node: Any) -> bool:
    """Whether a Node is tainted to keep ordinary pods off (they run on the workers)."""
    return any(t.key == CONTROL_PLANE_ROLE for t in node.spec.taints or [])


def on_control_plane(kube_api: Any) -> list[str]:
    """Helm flags that put the operator on the control-plane node when the cluster has a dedicated one
    (make cluster-up NODES=3), as platform teams place system components: a worker lost by a test
    must not take the operator with it."""
    from kubernetes import client

    nodes = client.CoreV1Api(kube_api).list_node().items
    if not any(dedicated_control_plane(n) for n in nodes):
        return []
    return ["--set-json", f'nodeSelector={{"{CONTROL_PLANE_ROLE}": ""}}',
            "--set-json", f'tolerations=[{{"key": "{CONTROL_PLANE_ROLE}", "operator": "Exists", '
                          '"effect": "NoSchedule"}]']


def pod_logs(namespace: str, pod: str) -> str:
    return kubectl("-n", namespace, "logs", pod).stdout


def pod_of_rank(pods: list[Any], rank: int) -> Any:
    for pod in pods:
        if pod.metadata.annotations.get("batch.kubernetes.io/job-completion-index") == str(rank):
            return pod
    pytest.fail(f"no pod of completion index {rank} among {[p.metadata.name for p in pods]}")


def digits_by_class(root: Path, per_class: int) -> Path:
    """scikit-learn's bundled digits (8x8 grey scans of handwritten digits; real images that no one here
    made) as a folder per class, in the kinds of files people have: grayscale and CMYK JPEG, RGBA PNG and
    RGB `.JPG`; plus one file that does not decode."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    kinds = [("L", ".jpg"), ("CMYK", ".jpg"), ("RGBA", ".png"), ("RGB", ".JPG")]
    chosen = [i for d in range(10) for i in (digits.target == d).nonzero()[0][:per_class]]
    for i, (pixels, label) in enumerate(zip(digits.images[chosen], digits.target[chosen], strict=True)):
        mode, suffix = kinds[i % len(kinds)]
        path = root / f"digit_{label}" / f"{i:04d}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        grey = Image.fromarray((pixels * 255 / 16).astype("uint8")).resize((32, 32))
        grey.convert(mode).save(path)
    (root / "digit_0" / "scan_broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 cut off here")
    return root


CLUSTER_SH = REPO / "tests" / "cluster" / "cluster.sh"


def addon(name: str) -> None:
    """Install an add-on into the running cluster (idempotent; fast when it is already there)."""
    result = subprocess.run([str(CLUSTER_SH), "addon-up", name], text=True, capture_output=True)
    if result.returncode != 0:
        pytest.fail(f"cluster.sh addon-up {name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


LIVE_TENANTS: list[Trainings] = []  # the tenants of the tests running now, newest last


@contextlib.contextmanager
def tenant_namespace(kube_api: Any, prefix: str) -> Iterator[Trainings]:
    """A fresh namespace, ready for pods, and the PetsTrainings in it; deleted afterwards."""
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    wait_for(f"namespace {name} default ServiceAccount",
             lambda: core.list_namespaced_service_account(
                 name, field_selector="metadata.name=default").items, 60, 0.5)
    tenant = Trainings(kube_api, name)
    LIVE_TENANTS.append(tenant)  # a failed test's evidence (evidence.py) is read before the namespace goes
    try:
        yield tenant
    finally:
        LIVE_TENANTS.remove(tenant)
        core.delete_namespace(name, propagation_policy="Foreground")
