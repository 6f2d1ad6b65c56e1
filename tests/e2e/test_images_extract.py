"""The dataset initializer's extraction, run by the trainer image's own Python beside the host's (issue 43).

The image's Python (3.11.2) has no ``tarfile.data_filter`` and the host's (3.11.7) has: the initializer
once took another path in the image, which dropped a device node silently. Now ``pets_training.archive``
is the one path; this test runs it on the same hostile and honest archives in both interpreters and
wants the same outcome, member for member, message for message. Run by `make test-images`.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from test_images import REPO, TRAINER, docker

pytestmark = pytest.mark.e2e

PROBE = """
import json, sys, tarfile
from pathlib import Path
from pets_training.archive import ArchiveError, unpack
archives, out = Path(sys.argv[1]), Path(sys.argv[2])
results = {"python": sys.version.split()[0], "data_filter": hasattr(tarfile, "data_filter")}
for archive in sorted(archives.iterdir()):
    cap = 8 << 20 if archive.name.startswith("cap-") else None
    try:
        count, written = unpack(archive, out / archive.name, "the archive", cap, "8Mi")
        files = sorted(p.relative_to(out / archive.name).as_posix() for p in (out / archive.name).rglob("*"))
        results[archive.name] = ["ok", count, written, files]
    except ArchiveError as err:
        results[archive.name] = ["refused", str(err).replace(str(archive.stat().st_size), "SIZE")]
print(json.dumps(results))
"""


def _tar(path: Path, members: list[tuple[str, bytes, int]], mode: str = "w:gz") -> None:
    with tarfile.open(path, mode) as tar:  # type: ignore[call-overload]
        for name, kind, size in members:
            info = tarfile.TarInfo(name)
            info.type, info.size = kind, size if kind == tarfile.REGTYPE else 0
            info.linkname = "/etc/passwd" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
            tar.addfile(info, io.BytesIO(bytes(size)) if kind == tarfile.REGTYPE else None)


def archives(root: Path) -> Path:
    root.mkdir()
    ok = [("set/", tarfile.DIRTYPE, 0), ("set/cat_1.jpg", tarfile.REGTYPE, 100), ("set/a/b/dog_2.jpg",
                                                                                  tarfile.REGTYPE, 5000)]
    _tar(root / "ok.tar.gz", ok)
    _tar(root / "ok.tar", ok, "w")
    for kind, label in ((tarfile.SYMTYPE, "symlink"), (tarfile.LNKTYPE, "hardlink"), (tarfile.CHRTYPE, "chr"),
                        (tarfile.BLKTYPE, "blk"), (tarfile.FIFOTYPE, "fifo"), (b"V", "volume-label")):
        _tar(root / f"{label}.tar.gz", [*ok, ("set/special", kind, 0)])
    for i, name in enumerate(("../escape.jpg", "/abs.jpg", "set/../../up.jpg")):
        _tar(root / f"escape-{i}.tar", [(name, tarfile.REGTYPE, 1)], "w")
    _tar(root / "cap-bomb.tar.gz", [("set/a.bin", tarfile.REGTYPE, 6 << 20),
                                    ("set/b.bin", tarfile.REGTYPE, 6 << 20)])
    _tar(root / "ratio-bomb.tar.gz", [("set/zeros.bin", tarfile.REGTYPE, 80 << 20)])
    with zipfile.ZipFile(root / "ok.zip", "w") as zf:
        zf.writestr("set/cat_1.jpg", b"meow")
    with zipfile.ZipFile(root / "slip.zip", "w") as zf:
        zf.writestr("../../slip.jpg", b"x")
    link = zipfile.ZipInfo("set/link")
    link.external_attr = 0o120777 << 16
    with zipfile.ZipFile(root / "link.zip", "w") as zf:
        zf.writestr(link, "/etc/passwd")
    return root


def test_the_image_and_the_host_extract_the_same_way(tmp_path: Path) -> None:
    folder = archives(tmp_path / "archives")
    host = subprocess.run([sys.executable, "-c", PROBE, str(folder), str(tmp_path / "host")], text=True,
                          capture_output=True, env={"PYTHONPATH": str(REPO / "src")}, check=True)
    here = json.loads(host.stdout)
    tmp_path.chmod(0o755)
    folder.chmod(0o755)
    image = docker("run", "--rm", "--network", "none", "-v", f"{folder}:/archives:ro", "--entrypoint",
                   "python3", TRAINER, "-c", PROBE, "/archives", "/tmp/out")
    there = json.loads(image.stdout)
    print(f"host Python {here['python']} (data filter: {here['data_filter']}); "
          f"image Python {there['python']} (data filter: {there['data_filter']})")
    for key in ("python", "data_filter"):
        here.pop(key), there.pop(key)
    assert there == here
    # and what that outcome is: the honest archives whole, every special member refused by name
    assert here["ok.tar.gz"] == here["ok.tar"] == ["ok", 3, 4 * 4096, ["set", "set/a", "set/a/b",
                                                                     "set/a/b/dog_2.jpg", "set/cat_1.jpg"]]
    for label, kind in (("symlink", "symbolic link"), ("hardlink", "hard link"), ("chr", "character device"),
                        ("blk", "block device"), ("fifo", "FIFO"), ("volume-label", "special member")):
        assert here[f"{label}.tar.gz"][0] == "refused" and f"has a {kind}" in here[f"{label}.tar.gz"][1] \
            and "'set/special'" in here[f"{label}.tar.gz"][1], here[f"{label}.tar.gz"]
    assert all("member outside its folder" in here[f"escape-{i}.tar"][1] for i in range(3)), here
    cap = here["cap-bomb.tar.gz"][1]
    assert "spec.dataset.cache.size" in cap and "'set/b.bin'" in cap, cap
    assert "more than 100 times" in here["ratio-bomb.tar.gz"][1], here["ratio-bomb.tar.gz"]
    assert here["ok.zip"][0] == "ok" and "outside" in here["slip.zip"][1], here
    assert "symbolic link" in here["link.zip"][1], here["link.zip"]
