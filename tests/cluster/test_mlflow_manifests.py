"""mlflow_manifests.py: the MLflow add-on's objects. That they run (the server answers the trainers and
keeps their runs) is tests/e2e/test_tracking.py's, on the cluster (`cluster.sh addon-up mlflow`)."""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
import mlflow_manifests as mm  # noqa: E402

pytestmark = pytest.mark.unit


def by_kind() -> dict[str, dict]:
    docs = list(yaml.safe_load_all(mm.dump(mm.mlflow("localhost/pets-training/mlflow:test"))))
    return {d["kind"]: d for d in docs}


def test_the_server_keeps_sqlite_and_the_artifacts_on_its_claim_and_serves_them() -> None:
    docs = by_kind()
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (ctr,) = pod["containers"]
    args = ctr["args"]
    assert args[:3] == ["-m", "mlflow", "server"]
    assert args[args.index("--backend-store-uri") + 1] == "sqlite:////data/mlflow.db"
    assert args[args.index("--artifacts-destination") + 1] == "/data/artifacts"
    assert "--serve-artifacts" in args
    assert {"name": "data", "persistentVolumeClaim": {"claimName": mm.NAME}} in pod["volumes"]
    assert docs["PersistentVolumeClaim"]["metadata"]["name"] == mm.NAME
    assert docs["Deployment"]["spec"]["strategy"] == {"type": "Recreate"}  # one SQLite writer at a time
    assert ctr["imagePullPolicy"] == "Never"  # the node has it (addons.sh imports it)


def test_the_uri_trainings_name_is_the_service_s_and_a_host_the_server_answers() -> None:
    docs = by_kind()
    host = urlsplit(mm.URI).netloc
    assert host == f"{docs['Service']['metadata']['name']}.{mm.NAMESPACE}.svc:{mm.PORT}"
    (ctr,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert host in ctr["args"][ctr["args"].index("--allowed-hosts") + 1].split(",")
    labels = docs["Namespace"]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
