"""oci_archive.py makes archives that are valid OCI layouts and the same bytes every time.

(That containerd really imports and runs them is shown by the local cluster itself: its pause and
CoreDNS images and the smoke tests' image are all made by it.)
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import stat
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

_spec = importlib.util.spec_from_file_location("oci_archive", Path(__file__).with_name("oci_archive.py"))
assert _spec and _spec.loader
oci_archive = importlib.util.module_from_spec(_spec)
sys.modules["oci_archive"] = oci_archive  # dataclasses look their module up there
_spec.loader.exec_module(oci_archive)


def make_rootfs(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    tool = root / "bin" / "tool"
    tool.write_bytes(b"#!/bin/sh\necho hi\n")
    tool.chmod(0o755)
    (root / "etc").mkdir()
    (root / "etc" / "link").symlink_to("../bin/tool")
    return root


def build(tmp_path: Path, name: str) -> Path:
    out = tmp_path / f"{name}.tar"
    rc = oci_archive.main(
        [
            "--rootfs",
            str(make_rootfs(tmp_path / name)),
            "--name",
            "localhost/test/img:1.0",
            "--entrypoint",
            "/bin/tool",
            "--user",
            "65534:65534",
            "--output",
            str(out),
        ]
    )
    assert rc == 0
    return out


def test_archive_is_a_consistent_oci_layout(tmp_path: Path) -> None:
    with tarfile.open(build(tmp_path, "a")) as tar:
        blobs = {
            m.name.rsplit("/", 1)[1]: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.name.startswith("blobs/sha256/")
        }
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        assert json.load(tar.extractfile("oci-layout")) == {"imageLayoutVersion": "1.0.0"}  # type: ignore[arg-type]
    for digest, data in blobs.items():
        assert hashlib.sha256(data).hexdigest() == digest
    (desc,) = index["manifests"]
    assert desc["annotations"]["io.containerd.image.name"] == "localhost/test/img:1.0"
    assert desc["annotations"]["org.opencontainers.image.ref.name"] == "1.0"
    assert desc["platform"] == {"architecture": "amd64", "os": "linux"}
    manifest = json.loads(blobs[desc["digest"].split(":")[1]])
    config = json.loads(blobs[manifest["config"]["digest"].split(":")[1]])
    assert config["config"]["Entrypoint"] == ["/bin/tool"]
    assert config["config"]["User"] == "65534:65534"
    layer_digest = manifest["layers"][0]["digest"]
    assert config["rootfs"]["diff_ids"] == [layer_digest]

    layer = blobs[layer_digest.split(":")[1]]
    with tarfile.open(fileobj=io.BytesIO(layer)) as lt:
        members = {m.name: m for m in lt.getmembers()}
    assert sorted(members) == ["bin", "bin/tool", "etc", "etc/link"]
    assert stat.S_IMODE(members["bin/tool"].mode) == 0o755
    assert members["etc/link"].issym() and members["etc/link"].linkname == "../bin/tool"
    assert all(m.mtime == 0 for m in members.values())


def test_same_input_same_bytes(tmp_path: Path) -> None:
    assert build(tmp_path, "a").read_bytes() == build(tmp_path, "b").read_bytes()


def test_bad_input_names_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        oci_archive.main(["--rootfs", str(tmp_path / "missing"), "--name", "x:1", "--output", "o.tar"])
    assert f"--rootfs: '{tmp_path / 'missing'}' is not a directory" in capsys.readouterr().err
