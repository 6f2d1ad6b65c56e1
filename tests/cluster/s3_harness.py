"""Put test data into the local cluster's S3 server (the `s3` add-on: `make cluster-up S3=1`), with
MinIO's S3 client: the library the trainer's dataset initializer fetches with (boto3 cannot join the
dev environment: botocore pins python-dateutil<3, the operator's kubernetes client needs >=3).

    from s3_harness import S3_ACCESS_KEY, S3_SECRET_KEY, endpoint_from_host, put_tree
    with endpoint_from_host() as endpoint:            # the in-cluster Service, seen from this host
        keys = put_tree(endpoint, S3_ACCESS_KEY, S3_SECRET_KEY, "datasets", "pets/v1", Path("data"))

In the cluster the server is http://s3.pets-s3.svc:7070 (path-style addressing, region us-east-1),
with the root credentials in Secret pets-s3/s3-credentials (keys AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_REGION); addon_manifests.py holds their fixed values.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

# The add-on's constants (addon_manifests.py), repeated here so that this file imports without PyYAML.
S3_NAMESPACE = "pets-s3"
S3_SERVICE = "s3"
S3_PORT = 7070
S3_REGION = "us-east-1"
S3_ENDPOINT = f"http://{S3_SERVICE}.{S3_NAMESPACE}.svc:{S3_PORT}"  # from pods
S3_ACCESS_KEY = "pets-s3-root"
S3_SECRET_KEY = "pets-s3-root-secret-for-tests-only"

def put_tree(
    endpoint: str,
    access_key: str,
    secret_key: str,
    bucket: str,
    prefix: str,
    local_dir: Path | str,
    region: str = S3_REGION,
) -> list[str]:
    """Upload every file under `local_dir` to s3://bucket/prefix/<relative path> (the bucket made if
    missing); the keys written, sorted. Objects of the same keys are overwritten, others kept."""
    from minio import Minio

    local_dir = Path(local_dir)
    if not local_dir.is_dir():
        raise NotADirectoryError(local_dir)
    where = urlparse(endpoint)
    client = Minio(where.netloc, access_key=access_key, secret_key=secret_key, secure=where.scheme == "https",
                   region=region)
    if not client.bucket_exists(bucket):
        client.make_bucket(bucket)
    prefix = prefix.strip("/")
    keys = []
    for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(local_dir).as_posix()
        key = f"{prefix}/{rel}" if prefix else rel
        client.fput_object(bucket, key, str(path))
        keys.append(key)
    return keys


# ------------------------------------------------------------------ reaching the Service from the host
def _kubeconfig() -> str:
    """$KUBECONFIG, else the local cluster's admin kubeconfig (as tests/e2e do)."""
    return os.environ.get("KUBECONFIG") or str(
        Path(os.environ.get("PETS_STATE", "/tmp/pets-training-cluster")) / "kubeconfig")


def _kubectl(*args: str, kubeconfig: str | None = None, timeout: float = 30) -> str:
    env = {**os.environ, "KUBECONFIG": kubeconfig or _kubeconfig()}
    return subprocess.run(["kubectl", *args], env=env, text=True, capture_output=True, check=True,
                          timeout=timeout).stdout


def _answers(host: str, port: int, timeout: float = 2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def port_forward(
    kubeconfig: str | None = None, namespace: str = S3_NAMESPACE, service: str = S3_SERVICE,
    port: int = S3_PORT, timeout: float = 30,
) -> Iterator[str]:
    """`kubectl port-forward svc/s3` on a free local port, for as long as the block runs; yields the
    endpoint (http://127.0.0.1:PORT). Works for every cluster flavour (local, its extra nodes, kind)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        local = s.getsockname()[1]
    env = {**os.environ, "KUBECONFIG": kubeconfig or _kubeconfig()}
    argv = ["kubectl", "-n", namespace, "port-forward", "--address=127.0.0.1", f"svc/{service}",
            f"{local}:{port}"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + timeout
        while not _answers("127.0.0.1", local, 1):
            if proc.poll() is not None:
                out = proc.stdout.read() if proc.stdout else ""
                raise RuntimeError(f"kubectl port-forward svc/{service} exited: {out}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"kubectl port-forward svc/{service}: nothing on :{local} in {timeout} s")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{local}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def endpoint_from_host(kubeconfig: str | None = None) -> Iterator[str]:
    """The S3 Service as this host reaches it: its ClusterIP directly where the host routes to it (the
    `local` cluster's single node is this host: kube-proxy's rules apply to its own traffic), else
    through `kubectl port-forward`."""
    ip = _kubectl("-n", S3_NAMESPACE, "get", "svc", S3_SERVICE, "-o", "jsonpath={.spec.clusterIP}",
                  kubeconfig=kubeconfig).strip()
    if ip and _answers(ip, S3_PORT):
        yield f"http://{ip}:{S3_PORT}"
        return
    with port_forward(kubeconfig) as endpoint:
        yield endpoint
