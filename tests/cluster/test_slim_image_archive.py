"""slim_image_archive.py turns docker's legacy `docker save` archive into an OCI layout, learns which
chain each `<v1 id>/layer.tar` is, and leaves out the layers a node has unpacked.

(That containerd imports the result, reuses the left-out layers and runs pods from it is shown by
the e2e suite: load-image.sh loads the trainer this way into nodes that held an earlier build.)
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

_spec = importlib.util.spec_from_file_location("slim_image_archive",
                                               Path(__file__).with_name("slim_image_archive.py"))
assert _spec and _spec.loader
slim = importlib.util.module_from_spec(_spec)
sys.modules["slim_image_archive"] = slim  # dataclasses look their module up there
_spec.loader.exec_module(slim)

BASE, APP = b"base layer bytes" * 100, b"app layer"
BASE_ID, APP_ID = "a" * 64, "b" * 64


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def legacy_archive() -> bytes:
    """What Docker 20.10's `docker save pets/app:1` writes: v1 directories, a config, manifest.json."""
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": [sha(BASE), sha(APP)]}}).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": ["pets/app:1"],
                            "Layers": [f"{BASE_ID}/layer.tar", f"{APP_ID}/layer.tar"]}]).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for v1_id, layer in ((BASE_ID, BASE), (APP_ID, APP)):
            add(f"{v1_id}/VERSION", b"1.0")
            add(f"{v1_id}/json", b"{}")
            add(f"{v1_id}/layer.tar", layer)
        add(config_name, config)
        add("manifest.json", manifest)
        add("repositories", b"{}")
    return buf.getvalue()


def convert(archive: bytes, present: set[str], layer_map: dict[str, str]) -> dict[str, bytes]:
    out = io.BytesIO()
    slim.convert(io.BytesIO(archive), out, present, layer_map)
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def the_manifest(files: dict[str, bytes]) -> dict:
    index = json.loads(files["index.json"])
    (entry,) = index["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "docker.io/pets/app:1"
    (manifest,) = [data for data in files.values() if sha(data) == entry["digest"]]
    return json.loads(manifest)


def test_a_legacy_archive_becomes_an_oci_layout_with_every_layer_and_the_map_is_learned() -> None:
    layer_map: dict[str, str] = {}
    files = convert(legacy_archive(), set(), layer_map)
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    manifest = the_manifest(files)
    assert [(layer["digest"], layer["size"]) for layer in manifest["layers"]] == \
        [(sha(BASE), len(BASE)), (sha(APP), len(APP))]
    blobs = set(files.values())
    assert BASE in blobs and APP in blobs
    assert not any(name.endswith(("VERSION", "/json", "manifest.json", "repositories")) for name in files)
    # The first layer's chain id is its digest; the next one's hashes the chain so far with it.
    app_chain = "sha256:" + hashlib.sha256(f"{sha(BASE)} {sha(APP)}".encode()).hexdigest()
    assert layer_map == {f"{BASE_ID}/layer.tar": sha(BASE), f"{APP_ID}/layer.tar": app_chain}


def test_a_layer_the_node_has_unpacked_is_left_out_but_stays_in_the_manifest() -> None:
    layer_map: dict[str, str] = {}
    convert(legacy_archive(), set(), layer_map)
    files = convert(legacy_archive(), {layer_map[f"{BASE_ID}/layer.tar"]}, layer_map)
    blobs = set(files.values())
    assert BASE not in blobs and APP in blobs
    assert [layer["digest"] for layer in the_manifest(files)["layers"]] == [sha(BASE), sha(APP)]


def test_an_unknown_layer_is_passed_on_even_when_a_snapshot_of_its_digest_exists() -> None:
    # Without the map, which chain a v1 directory holds is known only at the end: nothing is skipped.
    files = convert(legacy_archive(), {sha(BASE)}, {})
    assert BASE in set(files.values())


def test_an_oci_archive_passes_through_without_the_blobs_the_node_has() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("oci-layout", b"{}"), ("index.json", b'{"manifests": []}'),
                           (f"blobs/sha256/{sha(BASE)[7:]}", BASE), (f"blobs/sha256/{sha(APP)[7:]}", APP)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    files = convert(buf.getvalue(), {sha(BASE)}, {})
    assert set(files) == {"oci-layout", "index.json", f"blobs/sha256/{sha(APP)[7:]}"}


def test_containerd_names() -> None:
    assert slim.containerd_name("pets-training/trainer:0.1.0") == "docker.io/pets-training/trainer:0.1.0"
    assert slim.containerd_name("busybox:1") == "docker.io/library/busybox:1"
    assert slim.containerd_name("localhost/pets/x:1") == "localhost/pets/x:1"
