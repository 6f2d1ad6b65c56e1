"""End to end: spec.tracking.mlflow against a real MLflow tracking server (the `mlflow` add-on:
`cluster.sh addon-up mlflow`, http://mlflow.pets-mlflow.svc:5000, SQLite and artifacts on a claim).

A training that names the server Succeeds, and MLflow's own REST API then shows one run with its params,
5 epochs of eval accuracy, the model artifact, status FINISHED and the training's tags, as status.tracking
names it. With the server stopped (its Deployment scaled to 0) a second training Succeeds too, and its
TrackingDegraded condition says why.
"""

from __future__ import annotations

import contextlib
import json
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from polling import wait_for
from trainings import REPO, SMALL_SPEC, Trainings, addon, kubectl

pytestmark = pytest.mark.e2e

sys.path.insert(0, str(REPO / "tests" / "cluster"))
from mlflow_manifests import NAME, NAMESPACE, PORT, URI  # noqa: E402
from s3_harness import port_forward  # noqa: E402

# One rank is enough for the tracker (rank 0 logs); 5 epochs as the issue asks, on SMALL_SPEC's data.
TRACKED = {**SMALL_SPEC, "replicas": 1, "epochs": 5}


@pytest.fixture(scope="module")
def mlflow_server() -> None:
    addon("mlflow")


@contextlib.contextmanager
def mlflow_api() -> Iterator[Any]:
    """GET/POST of MLflow's REST API through a port-forward to its Service."""
    with port_forward(namespace=NAMESPACE, service=NAME, port=PORT) as base:
        def call(path: str, body: dict[str, Any] | None = None, **query: str) -> dict[str, Any]:
            url = f"{base}/api/2.0/mlflow/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
            data = json.dumps(body).encode() if body is not None else None
            request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as response:
                return dict(json.load(response))
        yield call


@contextlib.contextmanager
def server_stopped() -> Iterator[None]:
    """The server's Deployment at 0 replicas until the block ends, then back and Ready."""
    scale = ("-n", NAMESPACE, "scale", f"deployment/{NAME}")
    kubectl(*scale, "--replicas=0")
    try:
        pods = ("-n", NAMESPACE, "get", "pods", "-l", f"app.kubernetes.io/name={NAME}", "-o", "name")
        wait_for(f"the pods of deployment/{NAME} to go", lambda: not kubectl(*pods).stdout.strip(), 120, 1.0)
        yield
    finally:
        kubectl(*scale, "--replicas=1")
        kubectl("-n", NAMESPACE, "rollout", "status", f"deployment/{NAME}", "--timeout=300s")


def condition(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == ctype), {})


@pytest.mark.usefixtures("mlflow_server")
def test_a_tracked_training_is_one_finished_mlflow_run(trainings: Trainings) -> None:
    experiment = f"e2e-{trainings.namespace}"  # the server outlives the namespace: a run of this test only
    trainings.create("tracked", {**TRACKED, "tracking": {"mlflow": {"uri": URI, "experiment": experiment}}})
    status = trainings.wait_phase("tracked", "Succeeded")
    uid = trainings.get("tracked")["metadata"]["uid"]
    tracking = status.get("tracking") or {}
    assert tracking.get("ok") is True and tracking.get("mlflowRunId"), status
    assert condition(status, "TrackingDegraded").get("reason") == "TrackingOK", status["conditions"]

    with mlflow_api() as call:
        found = call("experiments/get-by-name", experiment_name=experiment)
        experiment_id = found["experiment"]["experiment_id"]
        runs = call("runs/search", {"experiment_ids": [experiment_id]}).get("runs") or []
        assert len(runs) == 1, runs  # one run for the training
        (run,) = runs
        run_id = run["info"]["run_id"]
        assert run_id == tracking["mlflowRunId"], (run_id, tracking)
        assert tracking["mlflowUrl"] == f"{URI}/#/experiments/{experiment_id}/runs/{run_id}", tracking
        assert run["info"]["status"] == "FINISHED", run["info"]
        params = {p["key"]: p["value"] for p in run["data"].get("params") or []}
        assert (params.get("epochs"), params.get("model"), params.get("world_size")) == \
            ("5", "resnet18", "1"), params
        tags = {t["key"]: t["value"] for t in run["data"].get("tags") or []}
        assert tags.get("training.pets.dev/uid") == uid, tags
        assert tags.get("training.pets.dev/namespace") == trainings.namespace, tags
        history = call("metrics/get-history", run_id=run_id, metric_key="eval/accuracy")["metrics"]
        assert len({m["step"] for m in history}) == 5, history  # one point an epoch
        assert all(0.0 <= m["value"] <= 1.0 for m in history), history
        files = {f["path"]: f for f in call("artifacts/list", run_id=run_id).get("files") or []}
        assert {"model.safetensors", "summary.json"} <= set(files), files
        assert int(files["model.safetensors"].get("file_size", 0)) > 0, files
    print(f"[tracking] run {run_id}: {len(params)} params, {len(history)} epochs of eval/accuracy, "
          f"artifacts {sorted(files)}")


@pytest.mark.usefixtures("mlflow_server")
def test_a_training_with_the_server_stopped_succeeds_and_says_so(trainings: Trainings) -> None:
    with server_stopped():
        trainings.create("untracked", {**TRACKED, "epochs": 1,
                                       "tracking": {"mlflow": {"uri": URI, "experiment": "e2e-stopped"}}})
        status = trainings.wait_phase("untracked", "Succeeded")
    degraded = condition(status, "TrackingDegraded")
    assert (degraded.get("status"), degraded.get("reason")) == ("True", "TrackingServerFailed"), status
    assert "MLflow" in degraded["message"], degraded
    assert (status.get("tracking") or {}).get("ok") is False, status
    print(f"[tracking] server stopped: {degraded['message']}")
