"""An upgrade from the previous release with trainings in flight, and a rollback (make test-upgrade).

tests/e2e/upgrade.sh builds the previous release's images and unpacks its chart; here it is installed
as it was released (its own CRD), trainings are started under it in every state a platform team has
when it upgrades (running, suspended after a checkpoint, queued under Kueue, succeeded and kept), and
the operator is upgraded as docs/chart.md says: the CRD applied server-side, then `helm upgrade`. Every
training must go on as if nothing happened; then `helm rollback` to the previous release, with a
training of the new one running.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from polling import wait_for
from trainings import (
    LONGER_SPEC,
    OPERATOR_NAMESPACE,
    POLL_S,
    RELEASE,
    REPO,
    SMALL_SPEC,
    Trainings,
    cluster_kubeconfig,
    helm_binary,
    kubectl,
    on_control_plane,
    tenant_namespace,
)

from pets_contract import __version__

pytestmark = pytest.mark.upgrade

PREVIOUS = os.environ.get("PETS_PREVIOUS_VERSION", "")
PREVIOUS_CHART = Path(os.environ.get("PETS_PREVIOUS_CHART", "/nonexistent"))
KUEUE = ("kueue.x-k8s.io", "v1beta2")
# Four trainings at once on the two 2-core workers: less CPU than the e2e suite's pods. 3Gi: on a CPU
# without bf16 instructions the trainer runs fp32, and a rank 0 at 128 px was OOM-killed at 2Gi. Each
# outlasts the upgrade by its number of epochs; after it, the rest of them is only waited for.
POD = {"resources": {"cpu": "400m", "memory": "3Gi"}}
RESUMED = "resume: continuing"


def helm(*args: str) -> None:
    env = {**os.environ, "KUBECONFIG": str(cluster_kubeconfig())}
    subprocess.run([helm_binary(), *args, "--namespace", OPERATOR_NAMESPACE], env=env, check=True)


def operator_image() -> str:
    out = kubectl("-n", OPERATOR_NAMESPACE, "get", "deploy", "-l", "app.kubernetes.io/instance=" + RELEASE,
                  "-o", "jsonpath={.items[0].spec.template.spec.containers[0].image}").stdout
    return out.strip()


@pytest.fixture(scope="module")
def previous_release(kube_api: Any) -> Iterator[None]:
    """The previous release installed with its own CRD, as a platform team had it; uninstalled after."""
    if not PREVIOUS or not PREVIOUS_CHART.is_dir():
        pytest.fail("run it through tests/e2e/upgrade.sh (make test-upgrade): it builds the previous release")
    helm("uninstall", RELEASE, "--ignore-not-found", "--wait")
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(PREVIOUS_CHART / "crds"))
    helm("install", RELEASE, str(PREVIOUS_CHART), "--create-namespace", "--set",
         "image.pullPolicy=IfNotPresent", *on_control_plane(kube_api), "--wait", "--timeout", "5m")
    assert operator_image().endswith(f":{PREVIOUS}"), operator_image()
    yield
    helm("uninstall", RELEASE, "--ignore-not-found", "--wait")


@pytest.fixture(scope="module")
def tenant(kube_api: Any, previous_release: None) -> Iterator[Trainings]:
    with tenant_namespace(kube_api, "upgrade") as trainings:
        yield trainings


def queue_spec(namespace: str, cpu: str, memory: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{
                "name": f"{namespace}-flavor",
                "resources": [{"name": "cpu", "nominalQuota": cpu},
                              {"name": "memory", "nominalQuota": memory}]}]}]}


@pytest.fixture(scope="module")
def closed_queue(tenant: Trainings) -> Iterator[str]:
    """A LocalQueue whose ClusterQueue has no room yet: a training waits in it across the upgrade."""
    group, version = KUEUE
    ns = tenant.namespace
    cluster: list[tuple[str, dict[str, Any]]] = [
        ("resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": f"{ns}-flavor"}, "spec": {}}),
        ("clusterqueues", {"kind": "ClusterQueue", "metadata": {"name": f"{ns}-cq"},
                           "spec": queue_spec(ns, "0", "0")}),
    ]
    api_version = f"{group}/{version}"
    for plural, body in cluster:
        body = {"apiVersion": api_version, **body}
        tenant.custom.create_cluster_custom_object(group, version, plural, body)
    tenant.custom.create_namespaced_custom_object(group, version, ns, "localqueues", {
        "apiVersion": api_version, "kind": "LocalQueue", "metadata": {"name": "later", "namespace": ns},
        "spec": {"clusterQueue": f"{ns}-cq"}})
    yield f"{ns}-cq"
    for plural, body in reversed(cluster):
        tenant.custom.delete_cluster_custom_object(group, version, plural, body["metadata"]["name"])


def open_queue(tenant: Trainings, cluster_queue: str) -> None:
    group, version = KUEUE
    tenant.custom.patch_cluster_custom_object(group, version, "clusterqueues", cluster_queue,
                                              {"spec": queue_spec(tenant.namespace, "2", "8Gi")})


def snapshot(tenant: Trainings, name: str) -> dict[str, Any]:
    """What an upgrade must leave alone: the workload, the pods and their restarts, the children's uids."""
    ns, status = tenant.namespace, tenant.status(name)
    children = {}
    for kind, child in (status.get("children") or {}).items():
        resource = {"job": "job", "service": "service", "networkPolicy": "networkpolicy",
                    "outputClaim": "pvc"}.get(kind)
        if resource:
            got = kubectl("-n", ns, "get", resource, child, "-o", "jsonpath={.metadata.uid}", check=False)
            children[kind] = got.stdout.strip() or None
    return {
        "jobs": sorted(j.metadata.uid for j in tenant.jobs(name)),
        "pods": sorted((p.metadata.uid, sum(c.restart_count for c in p.status.container_statuses or []))
                       for p in tenant.pods(name)),
        "attempt": status.get("attempt"), "restarts": status.get("restarts"), "children": children,
    }


def resumed_log(tenant: Trainings, name: str) -> str:
    """Rank 0's lines about where it resumed (its pod of the newest attempt)."""
    lines = []
    for pod in tenant.pods(name):
        logs = kubectl("-n", tenant.namespace, "logs", pod.metadata.name, "--all-containers", check=False)
        lines += [line for line in logs.stdout.splitlines() if "resume:" in line]
    return "\n".join(lines)


def test_an_upgrade_keeps_every_training_as_it_was(kube_api: Any, previous_release: None,
                                                   tenant: Trainings, closed_queue: str) -> None:
    # Under the previous release: one of each state.
    tenant.create("running", {**LONGER_SPEC, **POD, "epochs": 16})
    tenant.create("suspended", {**LONGER_SPEC, **POD, "epochs": 4})
    tenant.create("finished", {**SMALL_SPEC, **POD, "epochs": 1, "ttlSecondsAfterFinished": 3600})
    tenant.create("queued", {**SMALL_SPEC, **POD, "epochs": 1}, {"kueue.x-k8s.io/queue-name": "later"})
    wait_for("suspended's first checkpoint", lambda: (tenant.status_unless_failed("suspended")
                                                     .get("lastCheckpoint") or {})
             .get("epoch", 0) >= 1, 600, POLL_S)
    tenant.patch_spec("suspended", {"suspend": True})
    tenant.wait_phase("suspended", "Suspended", 300)
    wait_for("suspended's pods gone", lambda: not tenant.pods("suspended"), 120, POLL_S)
    tenant.wait_phase("finished", "Succeeded", 600)
    tenant.wait_phase("queued", "Queued", 300)
    tenant.wait_epoch("running", 1, 600)
    names = ["running", "suspended", "finished", "queued"]
    before = {name: snapshot(tenant, name) for name in names}
    finished_before = tenant.status("finished")
    print(f"[upgrade] under {PREVIOUS}: {json.dumps(before)}")

    # The upgrade, as docs/chart.md tells users.
    chart = REPO / "charts" / "pets-training"
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(chart / "crds"))
    helm("upgrade", RELEASE, str(chart), "--reset-then-reuse-values",
         "--wait", "--timeout", "5m")
    assert operator_image().endswith(f":{__version__}"), operator_image()
    # The new operator has read the running training once its status moves on.
    epoch = tenant.status("running").get("epoch") or 0
    tenant.wait_epoch("running", epoch + 1, 300)
    after = {name: snapshot(tenant, name) for name in names}
    print(f"[upgrade] under {__version__}: {json.dumps(after)}")
    assert after == before, "the upgrade itself changed a training's workload, pods or children"
    assert tenant.status("finished") == finished_before, "the upgrade rewrote a finished training's status"
    assert tenant.status("suspended")["phase"] == "Suspended" and not tenant.pods("suspended")
    queued = tenant.status("queued")
    assert queued["phase"] == "Queued" and all(j.spec.suspend for j in tenant.jobs("queued")), queued

    # Each goes on: the running one to the end on its pods, the suspended one from its checkpoint (the
    # previous release's trainer wrote it; this tree's resumes it), the queued one once there is room.
    tenant.patch_spec("suspended", {"suspend": False})
    open_queue(tenant, closed_queue)
    for name in ("running", "suspended", "queued"):
        status = tenant.wait_phase(name, "Succeeded")
        assert status["restarts"] == 0, status
    assert snapshot(tenant, "running")["jobs"] == before["running"]["jobs"]
    assert len(tenant.jobs("queued")) == 1
    log = resumed_log(tenant, "suspended")
    assert RESUMED in log and "starting fresh" not in log, log
    assert tenant.status("finished") == finished_before


def test_a_rollback_to_the_previous_release_keeps_a_running_training(
        kube_api: Any, previous_release: None, tenant: Trainings) -> None:
    assert operator_image().endswith(f":{__version__}"), "the upgrade test runs first"
    tenant.create("rolled-back", {**LONGER_SPEC, **POD, "epochs": 10})
    tenant.wait_epoch("rolled-back", 1, 600)
    before = snapshot(tenant, "rolled-back")

    # Helm rolls back the operator and its templates; it never touches crds/, so the CRD stays this
    # tree's (docs/chart.md, "Rolling back").
    helm("rollback", RELEASE, "1", "--wait", "--timeout", "5m")
    assert operator_image().endswith(f":{PREVIOUS}"), operator_image()
    epoch = tenant.status("rolled-back").get("epoch") or 0
    tenant.wait_epoch("rolled-back", epoch + 1, 300)
    assert snapshot(tenant, "rolled-back") == before
    status = tenant.wait_phase("rolled-back", "Succeeded")
    assert status["restarts"] == 0 and snapshot(tenant, "rolled-back")["jobs"] == before["jobs"], status
