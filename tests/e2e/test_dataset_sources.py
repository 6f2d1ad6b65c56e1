"""End to end: spec.dataset.url, fetched by the dataset init container into a cache claim.

The same real images (scikit-learn's digits as a folder per class) come over HTTP, as a .tar.gz from a
plain web server in the cluster, and from a bucket of the cluster's S3 server (the `s3` add-on, the
Versity S3 gateway: `cluster.sh addon-up s3`), with credentials from a Secret. A wrong sha256 and wrong
credentials fail at once (restarts 0), naming the field; a second training on the same bucket reads
the cache and downloads nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from trainings import REPO, SMALL_SPEC, Trainings, addon, digits_by_class, kubectl

from pets_contract.names import DEFAULT_IMAGE

pytestmark = pytest.mark.e2e

sys.path.insert(0, str(REPO / "tests" / "cluster"))
from s3_harness import S3_ACCESS_KEY, S3_ENDPOINT, S3_SECRET_KEY, endpoint_from_host, put_tree  # noqa: E402

IMAGE = DEFAULT_IMAGE  # the trainer image make e2e loaded
# one machine is enough to read a cache; the HTTP case runs two, whose init containers share the fetch
ONE = {**{k: v for k, v in SMALL_SPEC.items() if k != "dataset"}, "replicas": 1, "epochs": 1}
DIGITS = {"layout": "imagefolder", "images": 400, "classes": 10, "skipped": 1, "trainImages": 320,
          "evalImages": 80}


def web_server(trainings: Trainings, shared_claim: Callable[[str], Path], tmp_path: Path) -> tuple[str, str]:
    """digits.tar.gz served over HTTP by `python3 -m http.server` (the trainer image) behind a Service;
    returns its URL in the cluster and its sha256."""
    folder = shared_claim("www")
    with tarfile.open(folder / "digits.tar.gz", "w:gz") as tar:
        tar.add(digits_by_class(tmp_path / "digits", 40), arcname="digits")
    digest = hashlib.sha256((folder / "digits.tar.gz").read_bytes()).hexdigest()
    restricted = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                  "readOnlyRootFilesystem": True}
    manifests: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "labels": {"app": "web"}},
         "spec": {"securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                                      "seccompProfile": {"type": "RuntimeDefault"}},
                  "containers": [{"name": "web", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                                  "command": ["python3", "-m", "http.server", "8080", "--directory", "/srv"],
                                  "ports": [{"containerPort": 8080}],
                                  "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                                  "securityContext": restricted,
                                  "volumeMounts": [{"name": "www", "mountPath": "/srv", "readOnly": True}]}],
                  "volumes": [{"name": "www", "persistentVolumeClaim": {"claimName": "www"}}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
         "spec": {"selector": {"app": "web"}, "ports": [{"port": 8080}]}},
    ]
    kubectl("-n", trainings.namespace, "apply", "-f", "-", input_text=yaml.safe_dump_all(manifests))
    kubectl("-n", trainings.namespace, "wait", "--for=condition=Ready", "pod/web", "--timeout=180s")
    return f"http://web.{trainings.namespace}.svc:8080/digits.tar.gz", digest


def init_log(trainings: Trainings, name: str) -> str:
    (pod, *_) = trainings.pods(name)
    return kubectl("-n", trainings.namespace, "logs", pod.metadata.name, "-c", "dataset").stdout


def failed_at_once(trainings: Trainings, name: str) -> dict[str, Any]:
    status = trainings.wait_phase(name, "Failed")
    assert status.get("restarts", 0) == 0, status
    assert status["lastFailure"]["cause"] == "PermanentError", status["lastFailure"]
    return status


def test_an_archive_over_http_trains_and_a_wrong_digest_fails_at_once(
        trainings: Trainings, shared_claim: Callable[[str], Path], tmp_path: Path) -> None:
    url, digest = web_server(trainings, shared_claim, tmp_path)
    spec = {**SMALL_SPEC, "dataset": {"url": url, "sha256": digest}}
    trainings.create("http", spec)
    status = trainings.wait_phase("http", "Succeeded")
    assert status["dataset"] == DIGITS, status
    # both ranks' init containers ran; one fetched, the other found the data there
    logs = [kubectl("-n", trainings.namespace, "logs", p.metadata.name, "-c", "dataset").stdout
            for p in trainings.pods("http")]
    assert len(logs) == 2, logs
    assert sum("dataset fetched into the cache" in log for log in logs) == 1, logs
    assert sum("nothing to download" in log for log in logs) == 1, logs

    wrong = "0" * 64
    trainings.create("bad-digest", {**ONE, "dataset": {"url": url, "sha256": wrong}})
    status = failed_at_once(trainings, "bad-digest")
    message = status["lastFailure"]["message"]
    assert message.startswith("spec.dataset.sha256: the archive at") and digest in message, message

    # A URL the fetcher cannot even parse once crashed it (exit 1, a restart): it fails at once too, and
    # its query string (where a presigned URL's signature rides) is shown nowhere.
    secret = "s3cr3t-signature"
    broken = url.replace(":8080/", ":notaport/") + f"?X-Amz-Signature={secret}"
    trainings.create("bad-port", {**ONE, "dataset": {"url": broken}})
    status = failed_at_once(trainings, "bad-port")
    assert status["lastFailure"]["message"].startswith("spec.dataset.url: "), status["lastFailure"]
    events = kubectl("-n", trainings.namespace, "get", "events", "-o", "json").stdout
    assert secret not in json.dumps(status) and secret not in events


@pytest.fixture(scope="module")
def s3_server() -> None:
    addon("s3")


@pytest.mark.usefixtures("s3_server")
def test_a_bucket_trains_twice_from_one_download_and_wrong_credentials_fail(trainings: Trainings,
                                                                          tmp_path: Path) -> None:
    bucket, prefix = "datasets", f"{trainings.namespace}/digits"  # the server outlives the namespace
    with endpoint_from_host() as endpoint:
        keys = put_tree(endpoint, S3_ACCESS_KEY, S3_SECRET_KEY, bucket, prefix,
                        digits_by_class(tmp_path / "digits", 40))
    assert len(keys) == 401
    secrets = [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                "stringData": {"AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": secret}}
               for name, secret in (("s3-keys", S3_SECRET_KEY), ("s3-stale-keys", "not-the-secret"))]
    kubectl("-n", trainings.namespace, "apply", "-f", "-", input_text=yaml.safe_dump_all(secrets))
    source = {"url": f"s3://{bucket}/{prefix}",
              "s3": {"endpoint": S3_ENDPOINT, "credentialsSecret": "s3-keys"}}

    for name in ("s3-first", "s3-again"):
        trainings.create(name, {**ONE, "dataset": source})
        status = trainings.wait_phase(name, "Succeeded")
        assert status["dataset"] == DIGITS, status
    assert "downloaded 401 objects" in init_log(trainings, "s3-first")
    again = init_log(trainings, "s3-again")
    assert "nothing to download" in again and "downloaded 401 objects" not in again, again
    claims = kubectl("-n", trainings.namespace, "get", "pvc", "-l", "training.pets.dev/dataset-cache",
                     "-o", "name").stdout.split()
    assert len(claims) == 1, claims  # one cache for the source, read by both

    # another source (a cached one is read without asking the server), with keys the server refuses
    stale = {"url": f"s3://{bucket}/{prefix}-v2",
             "s3": {**source["s3"], "credentialsSecret": "s3-stale-keys"}}
    trainings.create("s3-stale", {**ONE, "dataset": stale})
    message = failed_at_once(trainings, "s3-stale")["lastFailure"]["message"]
    assert message.startswith("spec.dataset.s3.credentialsSecret:") and "'s3-stale-keys'" in message, message


def _zeros_tar_gz(path: Path, members: list[tuple[str, int, bytes]]) -> None:
    """A .tar.gz of (name, size, tar type) members, the files zeros (or random, under 'random/'), written
    without holding them: a decompression bomb is a few MB here."""
    class Source(io.RawIOBase):
        def __init__(self, size: int, random: bool) -> None:
            self.left, self.random = size, random

        def readable(self) -> bool:
            return True

        def readinto(self, b: Any) -> int:
            n = min(len(b), self.left, 1 << 20)
            b[:n] = os.urandom(n) if self.random else bytes(n)
            self.left -= n
            return n

    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for name, size, kind in members:
            info = tarfile.TarInfo(name)
            info.type, info.size = kind, size if kind == tarfile.REGTYPE else 0
            random = name.startswith("random/")
            tar.addfile(info, io.BufferedReader(Source(size, random)) if kind == tarfile.REGTYPE else None)


def test_a_bomb_stops_at_the_cache_size_and_a_device_node_is_named(
        trainings: Trainings, shared_claim: Callable[[str], Path], tmp_path: Path) -> None:
    """A .tar.gz of 12 MB that expands to 3 GiB, into a cache of 1Gi that the local storage does not
    enforce: the initializer stops at the cap from the members' headers, fails at once (exit 78,
    restarts 0) naming spec.dataset.cache.size, and leaves less than the cap on the volume. An archive
    holding a device node fails naming it: the image's Python (3.11.2, no data filter) once dropped it."""
    url, _ = web_server(trainings, shared_claim, tmp_path)
    www = shared_claim("www")
    gib = 1 << 30
    _zeros_tar_gz(www / "bomb.tar.gz", [("random/noise.bin", 12 << 20, tarfile.REGTYPE)]
                  + [(f"pets/zeros_{i}.bin", 256 << 20, tarfile.REGTYPE) for i in range(12)])
    with tarfile.open(www / "digits.tar.gz") as digits, tarfile.open(www / "device.tar", "w") as out:
        for member in digits:
            out.addfile(member, digits.extractfile(member) if member.isfile() else None)
        null = tarfile.TarInfo("digits/null")
        null.type, null.devmajor, null.devminor = tarfile.CHRTYPE, 1, 3
        out.addfile(null)
    base = url.rsplit("/", 1)[0]

    trainings.create("bomb", {**ONE, "dataset": {"url": f"{base}/bomb.tar.gz", "cache": {"size": "1Gi"}}})
    message = failed_at_once(trainings, "bomb")["lastFailure"]["message"]
    assert message.startswith("spec.dataset.cache.size: the archive at"), message
    assert "1Gi (1073741824 bytes)" in message, message
    assert "'pets/zeros_3.bin'" in message, message  # 12 MB + 3 x 256 MiB fit; the fourth would not
    (claim,) = kubectl("-n", trainings.namespace, "get", "pvc", "-l", "training.pets.dev/dataset-cache",
                       "-o", "jsonpath={.items[*].spec.volumeName}").stdout.split()
    volume = Path(kubectl("get", "pv", claim, "-o", "jsonpath={.spec.hostPath.path}").stdout)
    left = sum(p.stat().st_blocks * 512 for p in volume.rglob("*") if p.is_file())
    assert left < gib // 100, f"{left} bytes left in the cache"
    assert "pets/zeros_3.bin" in init_log(trainings, "bomb")

    trainings.create("device", {**ONE, "dataset": {"url": f"{base}/device.tar"}})
    message = failed_at_once(trainings, "device")["lastFailure"]["message"]
    assert message.startswith("spec.dataset.url: the archive at") and \
        "has a character device, 'digits/null': refused" in message, message
