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


def config_and_earlier_manifest() -> tuple[bytes, bytes]:
    """The config docker keeps for pets/app:1 (a new revision label, the same layers) and the manifest
    of the build the node holds, as the first slim load wrote it."""
    files = convert(legacy_archive(), set(), {})
    earlier = the_manifest(files)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": {"revision": "2"}},
                         "rootfs": {"type": "layers", "diff_ids": [sha(BASE), sha(APP)]}}).encode()
    return config, json.dumps(earlier).encode()


def config_only(config: bytes, image_id: str, present: set[str], earlier: bytes) -> tuple[str | None, bytes]:
    out = io.BytesIO()
    why_not = slim.config_only(out, config, image_id, "pets/app:1", present, earlier)
    return why_not, out.getvalue()


def test_a_node_with_every_layer_unpacked_gets_the_config_alone_with_the_layers_sizes() -> None:
    config, earlier = config_and_earlier_manifest()
    why_not, layout = config_only(config, sha(config), set(slim.chain_ids([sha(BASE), sha(APP)])), earlier)
    assert why_not is None
    with tarfile.open(fileobj=io.BytesIO(layout)) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
    manifest = the_manifest(files)
    assert manifest["config"]["digest"] == sha(config) and config in set(files.values())
    assert [(layer["digest"], layer["size"]) for layer in manifest["layers"]] == \
        [(sha(BASE), len(BASE)), (sha(APP), len(APP))]
    assert BASE not in set(files.values()) and APP not in set(files.values())


@pytest.mark.parametrize(("case", "reason"), [
    ("a layer not unpacked", "1 of its 2 layers are not unpacked on the node"),
    ("no earlier manifest", "the node's earlier build does not give every layer's size"),
    ("another image's config", "the config read is not image"),
])
def test_the_config_alone_is_refused_writing_nothing_when_the_node_cannot_take_it(
        case: str, reason: str) -> None:
    config, earlier = config_and_earlier_manifest()
    chains = slim.chain_ids([sha(BASE), sha(APP)])
    present, image_id = set(chains), sha(config)
    if case == "a layer not unpacked":
        present = {chains[0]}
    elif case == "no earlier manifest":
        earlier = b""
    else:
        image_id = sha(b"another config")
    why_not, layout = config_only(config, image_id, present, earlier)
    assert why_not is not None and why_not.startswith(reason) and layout == b""
