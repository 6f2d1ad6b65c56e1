"""The dataset initializer's one extraction path (issue 43): its own member check, whatever the Python
version, and the bounds: the cache's size and the expansion ratio. Real archives, made here."""

from __future__ import annotations

import io
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from pets_training import dataset_init
from pets_training.archive import (
    BLOCK,
    EXPANSION_FLOOR,
    MAX_EXPANSION,
    ArchiveError,
    Member,
    blocks,
    check_member,
    quantity_bytes,
    unpack,
)

from .test_dataset_init import served  # noqa: F401 - the web server fixture

pytestmark = pytest.mark.unit
MIB = 1 << 20


class Zeros(io.RawIOBase):
    """``size`` zero bytes, read as a file, without holding them."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(b), self.left)
        b[:n] = bytes(n)
        self.left -= n
        return n


def _tar(path: Path, members: list[tarfile.TarInfo], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:  # type: ignore[call-overload]
        for info in members:
            tar.addfile(info, io.BufferedReader(Zeros(info.size)) if info.isreg() else None)
    return path


def _info(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, size, link
    return info


@pytest.mark.parametrize("info, kind", [
    (_info("pets/link.jpg", tarfile.SYMTYPE, link="/etc/passwd"), "symbolic link"),
    (_info("pets/hard.jpg", tarfile.LNKTYPE, link="pets/a.jpg"), "hard link"),
    (_info("pets/null", tarfile.CHRTYPE), "character device"),
    (_info("pets/disk", tarfile.BLKTYPE), "block device"),
    (_info("pets/pipe", tarfile.FIFOTYPE), "FIFO"),
    (_info("pets/odd", b"V"), "special member"),
])
def test_a_member_that_is_not_a_file_or_folder_is_refused_by_name(tmp_path: Path, info: tarfile.TarInfo,
                                                                  kind: str) -> None:
    archive = _tar(tmp_path / "a.tar.gz", [_info("pets/a.jpg", size=10), info])
    with pytest.raises(ArchiveError, match=rf"spec.dataset.url: the archive has a {kind}.*'{info.name}': "
                                           r"refused \(only files and folders"):
        unpack(archive, tmp_path / "out", "the archive")
    assert sorted(p.name for p in (tmp_path / "out" / "pets").iterdir()) == ["a.jpg"]


@pytest.mark.parametrize("name", ["../escaped.jpg", "/abs.jpg", "pets/../../escaped.jpg", "a\\..\\b.jpg"])
def test_a_name_that_leaves_the_folder_is_refused_in_tar_and_zip(tmp_path: Path, name: str) -> None:
    with pytest.raises(ArchiveError, match=r"member outside its folder: .*refused"):
        unpack(_tar(tmp_path / "a.tar", [_info(name, size=1)], "w"), tmp_path / "t", "the archive")
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as zf:
        zf.writestr(name, b"x")
    with pytest.raises(ArchiveError, match=r"member outside its folder"):
        unpack(tmp_path / "a.zip", tmp_path / "z", "the archive")
    assert not (tmp_path / "escaped.jpg").exists() and not Path("/abs.jpg").exists()


def test_a_zip_symlink_or_fifo_is_refused_and_files_folders_come_out_0644(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "ok.zip", "w") as zf:
        zf.writestr("set/cat/1.jpg", b"meow")
        zf.writestr(zipfile.ZipInfo("set/empty/"), b"")
    assert unpack(tmp_path / "ok.zip", tmp_path / "ok", "the archive") == (2, 2 * BLOCK)
    out = tmp_path / "ok" / "set" / "cat" / "1.jpg"
    assert out.read_bytes() == b"meow" and stat.S_IMODE(out.stat().st_mode) == 0o644
    assert (tmp_path / "ok" / "set" / "empty").is_dir()
    for mode, kind in ((stat.S_IFLNK | 0o777, "symbolic link"), (stat.S_IFIFO | 0o644, "FIFO")):
        info = zipfile.ZipInfo("set/special")
        info.external_attr = mode << 16
        with zipfile.ZipFile(tmp_path / "bad.zip", "w") as zf:
            zf.writestr(info, b"/etc/passwd")
        with pytest.raises(ArchiveError, match=f"has a {kind}, 'set/special'"):
            unpack(tmp_path / "bad.zip", tmp_path / f"bad-{kind[:4]}", "the archive")


def test_the_cap_refuses_a_member_from_its_header_before_writing_it(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "bomb.tar.gz", [_info("pets/a.jpg", size=3 * MIB),
                                              _info("pets/b.bin", size=64 * MIB)])
    size = archive.stat().st_size
    message = (r"spec.dataset.cache.size: the archive does not fit in the cache's 8Mi \(8388608 bytes\): the "
               rf"archive's {size} bytes and 3145728 unpacked, and 'pets/b.bin' \(67108864 bytes\) would "
               "pass it")
    with pytest.raises(ArchiveError, match=message):
        unpack(archive, tmp_path / "out", "the archive", cap=8 * MIB, cap_text="8Mi")
    written = sum(p.stat().st_size for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert written == 3 * MIB, "the member that would pass the cap was not begun"


def test_many_small_members_are_counted_in_blocks(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "many.tar.gz", [_info(f"d/{i}", size=1) for i in range(300)])
    with pytest.raises(ArchiveError, match="spec.dataset.cache.size"):
        unpack(archive, tmp_path / "out", "the archive", cap=200 * BLOCK)
    assert len(list((tmp_path / "out" / "d").iterdir())) < 200


def test_an_archive_that_expands_past_the_ratio_is_a_bomb_even_without_a_cap(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "bomb.tar.gz", [_info("x/zeros.bin", size=EXPANSION_FLOOR + MIB)])
    assert archive.stat().st_size * MAX_EXPANSION < EXPANSION_FLOOR
    with pytest.raises(ArchiveError, match=rf"expands to more than {MAX_EXPANSION} times its "
                                           rf"{archive.stat().st_size} bytes .* at 'x/zeros.bin'"):
        unpack(archive, tmp_path / "out", "the archive")
    assert not (tmp_path / "out" / "x" / "zeros.bin").exists()
    # under the floor, a tiny archive may expand more than the ratio: a few small files
    small = _tar(tmp_path / "small.tar.gz", [_info(f"s/{i}.jpg", size=100) for i in range(50)])
    assert unpack(small, tmp_path / "small", "the archive") == (50, 50 * BLOCK)


def test_quantities_and_blocks() -> None:
    quantities = ("1Gi", "5Gi", "500M", "2e9", "1.5Ki", "100", ".5Mi", "2500m")
    assert [quantity_bytes("f", q) for q in quantities] == [
        1 << 30, 5 << 30, 500 * 10**6, 2 * 10**9, 1536, 100, 1 << 19, 2]
    with pytest.raises(ArchiveError, match=r"spec.dataset.cache.size: '5 GB' is not a storage quantity"):
        quantity_bytes("spec.dataset.cache.size", "5 GB")
    assert blocks(0) == BLOCK and blocks(BLOCK) == BLOCK and blocks(BLOCK + 1) == 2 * BLOCK
    assert check_member(Member("./a/b/", "folder", 0), "x") == ["a", "b"]


def test_the_initializer_stops_at_the_cache_size_and_leaves_nothing(tmp_path: Path,
                                                                    served: tuple[str, Path]) -> None:  # noqa: F811
    base, www = served
    _tar(www / "bomb.tar.gz", [_info("pets/zeros.bin", size=40 * MIB)])
    summary = tmp_path / "termination-log"
    code = dataset_init.main(["--url", f"{base}/bomb.tar.gz", "--cache", str(tmp_path / "c"),
                              "--summary-path", str(summary), "--cache-size", "16Mi"])
    assert code == 78
    assert "spec.dataset.cache.size: the archive at" in summary.read_text() and "16Mi" in summary.read_text()
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [".lock"]
    # a download larger than the cap is refused as it comes, before the cap is written
    (www / "big.bin").write_bytes(bytes(3 * MIB))
    source = dataset_init.Source(f"{base}/big.bin", cache_size="2Mi")
    with pytest.raises(dataset_init.SourceError,
                       match=r"spec.dataset.cache.size: the archive at .*big.bin \(3145728 bytes or more\) "
                             r"does not fit in the cache's 2Mi"):
        dataset_init.initialize(tmp_path / "c2", source)
    assert sorted(p.name for p in (tmp_path / "c2").iterdir()) == [".lock"]
