"""Unpacking a dataset archive, bounded: the project's own member check and writer, the one path.

Every member of a .tar (any compression) or .zip is checked here before a byte of it is written, the
same way whatever the Python version (the trainer image's 3.11.2 has no ``tarfile.data_filter``): a
plain relative name inside the folder, a file or a folder, nothing else. A link, a device, a FIFO or
any other special member is refused with its name, as is a name that leaves the folder.

What is written is bounded, counted in whole 4 KiB blocks (a file of 0 bytes still takes one): at
most ``cap`` bytes on the volume with the archive itself (spec.dataset.cache.size), and at most
MAX_EXPANSION times the archive's size (or EXPANSION_FLOOR, if larger). A member that would pass a
bound is refused from its header, before it is written: nothing larger than the cap is ever written.
"""

from __future__ import annotations

import os
import stat
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pets_contract import quantity

from .contract import PermanentError

BLOCK = 4096
MAX_EXPANSION = 100  # JPEG sets expand about 1.0x, text 3-10x; gzip's own limit is about 1,000x
EXPANSION_FLOOR = 64 << 20  # a tiny archive of a few files may expand more than 100x its bytes
COPY = 1 << 20


class ArchiveError(PermanentError):
    """The archive cannot be unpacked as it is: the message names the member or the bound."""


@dataclass(frozen=True)
class Member:
    """One entry of an archive, as its header states it."""

    name: str
    kind: str  # "file", "folder", or what else it is ("symbolic link", "FIFO", ...)
    size: int


def quantity_bytes(field: str, value: str) -> int:
    """A Kubernetes storage quantity ("1Gi", "500M", "2e9") in bytes; ArchiveError naming ``field``."""
    size = quantity.to_bytes(str(value).strip())
    if size is None:
        raise ArchiveError(f"{field}: {value!r} is not a storage quantity (such as 5Gi or 500M)")
    return size


def blocks(size: int) -> int:
    """The bytes a file of ``size`` takes on the volume, as this module counts them."""
    return max(1, -(-size // BLOCK)) * BLOCK


def tar_member(info: tarfile.TarInfo) -> Member:
    if info.isreg():
        kind = "file"
    elif info.isdir():
        kind = "folder"
    else:
        kind = {tarfile.SYMTYPE: "symbolic link", tarfile.LNKTYPE: "hard link", tarfile.CHRTYPE:
                "character device", tarfile.BLKTYPE: "block device", tarfile.FIFOTYPE: "FIFO"}.get(
                    info.type, f"special member (tar type {info.type!r})")
    return Member(info.name, kind, info.size if info.isreg() else 0)


def zip_member(info: zipfile.ZipInfo) -> Member:
    mode = info.external_attr >> 16  # the Unix mode, where the zip was made on Unix (else 0)
    if info.is_dir():
        kind = "folder"
    elif stat.S_IFMT(mode) not in (0, stat.S_IFREG):
        kind = {stat.S_IFLNK: "symbolic link", stat.S_IFCHR: "character device", stat.S_IFBLK:
                "block device", stat.S_IFIFO: "FIFO", stat.S_IFSOCK: "socket"}.get(
                    stat.S_IFMT(mode), f"special member (mode {mode:o})")
    else:
        kind = "file"
    return Member(info.filename, kind, info.file_size if kind == "file" else 0)


def check_member(member: Member, where: str) -> list[str]:
    """The member's path parts when it may be extracted: a file or a folder, under a plain relative name
    (no absolute name, no ``..``, no NUL or backslash); else ArchiveError naming it. ``where`` names
    the archive in the message."""
    name = member.name
    if member.kind not in ("file", "folder"):
        raise ArchiveError(f"spec.dataset.url: {where} has a {member.kind}, {name!r}: refused (only files "
                           "and folders are extracted)")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if (not name or name.startswith("/") or "\0" in name or "\\" in name or ".." in parts
            or (not parts and member.kind == "file")):
        raise ArchiveError(f"spec.dataset.url: {where} has a member outside its folder: {name!r}: refused")
    return parts


@dataclass
class Budget:
    """What unpacking may still write: ``cap`` bytes in all with the archive (None: no cap), and
    MAX_EXPANSION times the archive (EXPANSION_FLOOR at least)."""

    archive_bytes: int
    cap: int | None
    cap_text: str  # the cap as the spec gives it, for the message
    where: str
    written: int = 0

    def charge(self, member: Member) -> None:
        cost = blocks(member.size)
        total = self.archive_bytes + self.written + cost
        if self.cap is not None and total > self.cap:
            raise ArchiveError(
                f"spec.dataset.cache.size: {self.where} does not fit in the cache's {self.cap_text} "
                f"({self.cap} bytes): the archive's {self.archive_bytes} bytes and {self.written} unpacked, "
                f"and {member.name!r} ({member.size} bytes) would pass it; nothing more was written, and "
                "what was is removed. Give spec.dataset.cache.size more room")
        allowed = max(MAX_EXPANSION * self.archive_bytes, EXPANSION_FLOOR)
        if self.written + cost > allowed:
            raise ArchiveError(
                f"spec.dataset.url: {self.where} expands to more than {MAX_EXPANSION} times its "
                f"{self.archive_bytes} bytes ({allowed} bytes) at {member.name!r}: refused as a "
                f"decompression bomb; nothing more was written, and what was is removed")
        self.written += cost


def _write(path: Path, src: IO[bytes], size: int, name: str, where: str) -> None:
    """``size`` bytes of ``src`` into a new file at ``path`` (never through a link: O_NOFOLLOW), 0644."""
    if path.is_file() and not path.is_symlink():
        path.unlink()  # a name twice in the archive: the last one wins, as with tar
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(path, flags, 0o644), "wb") as out:
        left = size
        while left and (block := src.read(min(left, COPY))):
            out.write(block)
            left -= len(block)
    if left:
        raise ArchiveError(f"spec.dataset.url: {where} has a member, {name!r}, {left} bytes short of the "
                           f"{size} its header states")


def _place(dest: Path, parts: list[str], kind: str) -> Path:
    """The path of a member under ``dest``, its folders made (as real folders: none of them is a link,
    since nothing here makes one)."""
    path = dest.joinpath(*parts)
    folder = path if kind == "folder" else path.parent
    folder.mkdir(parents=True, exist_ok=True, mode=0o755)
    return path


def _members(archive: Path) -> Iterator[tuple[Member, IO[bytes] | None]]:
    """Each member of a tar (or else a zip) with a stream of its data (None for a folder or a refused
    kind)."""
    if tarfile.is_tarfile(archive):
        with tarfile.open(archive, mode="r|*") as tar:
            for info in tar:
                member = tar_member(info)
                yield member, tar.extractfile(info) if member.kind == "file" else None
        return
    with zipfile.ZipFile(archive) as zf:
        for zinfo in zf.infolist():
            member = zip_member(zinfo)
            if member.kind != "file":
                yield member, None
                continue
            with zf.open(zinfo) as data:
                yield member, data


def unpack(archive: Path, dest: Path, where: str, cap: int | None = None,
           cap_text: str = "") -> tuple[int, int]:
    """Unpack ``archive`` into the new folder ``dest``, each member checked (check_member) and charged
    (Budget) before it is written; returns (members, bytes counted). ArchiveError names what stopped
    it; what was written by then stays for the caller to remove."""
    if not (tarfile.is_tarfile(archive) or zipfile.is_zipfile(archive)):
        raise ArchiveError(f"spec.dataset.url: {where} is not a .tar, .tar.gz or .zip archive")
    budget = Budget(archive.stat().st_size, cap, cap_text or str(cap), where)
    dest.mkdir(parents=True)
    count = 0
    try:
        for member, data in _members(archive):
            parts = check_member(member, where)
            budget.charge(member)
            path = _place(dest, parts, member.kind)
            if data is not None:
                _write(path, data, member.size, member.name, where)
            count += 1
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as err:
        raise ArchiveError(f"spec.dataset.url: {where} cannot be unpacked: {err}") from err
    return count, budget.written
