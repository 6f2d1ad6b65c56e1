"""The MLflow add-on's objects (make cluster-up MLFLOW=1): a real tracking server for the trainings' runs.

Namespace pets-mlflow: a claim for the server's state, a one-replica Deployment of `mlflow server`
(the image addons-build.sh mlflow builds), a ClusterIP Service http://mlflow.pets-mlflow.svc:5000.

The backend is SQLite on the claim, and the artifacts are files beside it, served through the server
(--serve-artifacts: the trainers need no storage credentials). SQLite, not PostgreSQL: one server process
is the only writer (one replica, Recreate, one worker), the local-path claim is a local filesystem where
SQLite's locking holds, and a second server (Debian's postgresql, in an image of its own) would double
the add-on's start for no test that needs it. The claim keeps the runs across a restart of the server
(the e2e stops it and starts it again).

usage: mlflow_manifests.py --image IMG
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from addon_manifests import cluster_service, dump, restricted_security_context

Doc = dict[str, Any]

NAMESPACE = "pets-mlflow"
NAME = "mlflow"  # the Deployment, its container, the Service and the claim
PORT = 5000
URI = f"http://{NAME}.{NAMESPACE}.svc:{PORT}"  # what a training's spec.tracking.mlflow.uri names
LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "pets-training-tests"}
DATA = "/data"
# The Host headers it answers (its DNS-rebinding guard): the Service's names, a port-forward's and
# kubelet's probes (the pod's address).
ALLOWED_HOSTS = [f"{NAME}.{NAMESPACE}.svc:{PORT}", f"{NAME}.{NAMESPACE}.svc.cluster.local:{PORT}",
                 "localhost:*", "127.0.0.1:*", "10.*"]
REQUESTS = {"cpu": "50m", "memory": "256Mi"}
LIMITS = {"memory": "2Gi"}  # 1Gi: OOMKilled at start, over and over (2026-11-27, 3-node cluster)
CLAIM_SIZE = "2Gi"


def mlflow(image: str) -> list[Doc]:
    meta = {"namespace": NAMESPACE, "labels": dict(LABELS)}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": {
        **LABELS, "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/warn": "restricted"}}}
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": NAME, **meta},
             "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": CLAIM_SIZE}}}}
    pod_sc, ctr_sc = restricted_security_context()
    ctr = {
        "name": NAME,
        "image": image,
        "imagePullPolicy": "Never",
        "args": ["-m", "mlflow", "server", "--host", "0.0.0.0", "--port", str(PORT), "--workers", "1",
                 "--backend-store-uri", f"sqlite:///{DATA}/mlflow.db",
                 "--artifacts-destination", f"{DATA}/artifacts", "--serve-artifacts",
                 "--allowed-hosts", ",".join(ALLOWED_HOSTS)],
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        # Its imports take 20-30 s on a busy 2-core node.
        "startupProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 2,
                         "failureThreshold": 90},
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 10, "failureThreshold": 6},
        "resources": {"requests": dict(REQUESTS), "limits": dict(LIMITS)},
        "securityContext": ctr_sc,
        "volumeMounts": [{"name": "data", "mountPath": DATA}, {"name": "tmp", "mountPath": "/tmp"}],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, **meta},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # one writer of the SQLite file at a time
            "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
            "template": {"metadata": {"labels": dict(LABELS)}, "spec": {
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "securityContext": pod_sc,
                "containers": [ctr],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": NAME}},
                            {"name": "tmp", "emptyDir": {}}],
            }},
        },
    }
    return [namespace, claim, deployment, cluster_service(NAME, meta, "http", PORT)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", required=True)
    args = ap.parse_args(argv)
    sys.stdout.write(dump(mlflow(args.image)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
