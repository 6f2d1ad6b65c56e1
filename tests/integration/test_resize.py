"""Against a real API server with the operator running: `kubectl scale` resizes a running training through
the CRD's scale subresource (the test plays the job controller), within spec.elastic; `kubectl get pt`
shows the size it runs at and the size asked for."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from conftest import tool
from kubernetes import client
from pets_operator import api
from polling import wait_for
from test_operator_lifecycle import create_training, get_training, jobs, run_job, the_job

pytestmark = pytest.mark.integration


def kubectl(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("kubectl"), "--kubeconfig", kubeconfig, *args], capture_output=True,
                          text=True, timeout=60, check=False)


def _status(admin: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    return dict(((get_training(admin, ns, name) or {}).get("status")) or {})


def test_kubectl_scale_resizes_a_running_training(admin: client.ApiClient, operator: Any, namespace: str,
                                                  kubeconfig: str) -> None:
    create_training(admin, namespace, "elastic", replicas=2, elastic={"minReplicas": 1, "maxReplicas": 3})
    first = the_job(admin, namespace, "elastic")
    assert first.spec.parallelism == 2
    run_job(admin, namespace, "elastic", 2)
    wait_for("status.workloadActive", lambda: _status(admin, namespace, "elastic").get("workloadActive"))

    # The scale subresource reads status.replicas and the pods' selector.
    scale = json.loads(kubectl(kubeconfig, "get", "--raw", f"/apis/{api.GROUP}/{api.VERSION}/namespaces/"
                               f"{namespace}/{api.PLURAL}/elastic/scale").stdout)
    assert scale["spec"]["replicas"] == 2 and scale["status"]["replicas"] == 2
    assert scale["status"]["selector"] == ("training.pets.dev/training=elastic,"
                                           "app.kubernetes.io/component=trainer")

    # Out of spec.elastic: refused by the CRD's rule, naming the field, through the subresource too.
    out = kubectl(kubeconfig, "scale", "pt", "elastic", "-n", namespace, "--replicas", "4")
    assert out.returncode != 0 and "spec.replicas must be within spec.elastic.minReplicas" in out.stderr
    # Within it: taken while the workload runs; the gang is drained and attempt 1 built at the new size.
    out = kubectl(kubeconfig, "scale", "pt", "elastic", "-n", namespace, "--replicas", "1")
    assert out.returncode == 0, out.stderr
    wait_for("the 2-pod Job to go and a 1-pod one to replace it", lambda: [
        (j.metadata.name, j.spec.parallelism) for j in jobs(admin, namespace)] == [("elastic-r1", 1)])
    st = _status(admin, namespace, "elastic")
    assert (st["attempt"], st["restarts"], st["replicas"]) == (1, 0, 1)
    # The same checkpoint directory at both sizes: the new gang resumes from the old one's SIGTERM save.
    jobs_made = (first, the_job(admin, namespace, "elastic-r1"))
    args = [list(j.spec.template.spec.containers[0].args) for j in jobs_made]
    assert len({a[a.index("--checkpoint-dir") + 1] for a in args}) == 1
    assert args[0][args[0].index("--checkpoint-dir") + 1] == st["checkpointDir"]
    assert st["resize"]["from"] == 2 and st["resize"]["to"] == 1 and st["resize"]["reason"] == "Scaled"
    events = client.CoreV1Api(admin).list_namespaced_event(namespace, field_selector="reason=Resized").items
    assert [e.message.split(":")[0] for e in events] == ["2 -> 1 (Scaled)"]

    # The new gang runs: the resize is over, booked as resizing time, and each run's world size is listed.
    run_job(admin, namespace, "elastic-r1", 1)
    wait_for("the resize to settle", lambda: "resize" not in _status(admin, namespace, "elastic"))
    assert _status(admin, namespace, "elastic")["goodput"]["resizingSeconds"] > 0
    got = kubectl(kubeconfig, "get", "pt", "elastic", "-n", namespace)
    header, row = got.stdout.strip().splitlines()
    assert header.split()[:4] == ["NAME", "PHASE", "REPLICAS", "DESIRED"]
    assert row.split()[2:4] == ["1", "1"]
