"""`upload`'s pure parts: the local tree, the claim's size, what to copy, and the helper pod.

A helper pod with the trainer's image mounts the claim read-write; what is already there is listed
(size and sha256) and what is not goes in batches of one tar stream each (``batches``).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _api
from .errors import FetchError, UploadError
from .transfer import check_name, helper_pod

UPLOAD_DIR = "/data"  # where the upload pod mounts the whole claim (the trainer mounts its data there)
DATA_CLAIM_SUFFIX = "-data"
GIB = 1 << 30
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAMES_SHOWN = 5


@dataclass(frozen=True)
class LocalFile:
    """One file to upload: its name relative to the folder (with '/'), size, sha256 and local path."""

    name: str
    size: int
    sha256: str
    path: Path


@dataclass(frozen=True)
class UploadResult:
    """What `upload` did: files and bytes copied, files already there with the same sha256."""

    claim: str
    path: str
    copied: int
    skipped: int
    bytes_copied: int
    created_claim: bool = False

    def summary(self) -> str:
        where = f"claim {self.claim}" + (f" path {self.path}" if self.path != "/" else "")
        made = " (new claim)" if self.created_claim else ""
        return (f"copied {self.copied} files / {human_bytes(self.bytes_copied)} into {where}{made}, "
                f"skipped {self.skipped} already there")


def human_bytes(n: int) -> str:
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


# ----------------------------------------------------------------------------- arguments


def check_claim_name(claim: str) -> str:
    """``claim`` when it is a valid PersistentVolumeClaim name (a DNS subdomain); else UploadError."""
    if not isinstance(claim, str) or len(claim) > 253 or not _DNS_SUBDOMAIN.fullmatch(claim):
        raise UploadError(f"claim: {claim!r} is not a PersistentVolumeClaim name (lowercase letters, "
                          "digits, '-' and '.', starting and ending with a letter or digit, 253 at most)")
    return claim


def claim_dir(path: str) -> str:
    """The directory in the claim, as given (``/`` or ``/images``), as a relative path ("" for the
    root); UploadError for anything check_name would refuse ('..', spaces...)."""
    sub = str(path).strip("/")
    if sub:
        try:
            check_name(sub)
        except FetchError:
            raise UploadError(f"path: {path!r} is not a directory in the claim: letters, digits, '_', '.', "
                              "'-' and '/' (no '.' or '..' part)") from None
    return sub


def dataset_path(sub: str) -> str:
    """spec.dataset.persistentVolumeClaim.path for claim_dir's ``sub`` (absolute, as the CRD wants)."""
    return "/" + sub


def walk(local_dir: str | os.PathLike[str]) -> list[LocalFile]:
    """Every regular file under ``local_dir`` (recursively, sorted by name), with its size and sha256.

    A symlink to a file inside the folder is copied as that file; one that leads outside (or nowhere)
    is refused, as is a name check_name refuses. A symlinked directory is not followed (a link inside
    the folder leads to files that are copied under their own names). Sockets, FIFOs and devices are
    left out. UploadError names the argument and what is wrong, before any file is read."""
    given = Path(local_dir)
    if not given.exists():
        raise UploadError(f"local_dir: {str(local_dir)!r} does not exist")
    if not given.is_dir():
        raise UploadError(f"local_dir: {str(local_dir)!r} is not a directory")
    root = Path(os.path.realpath(given))
    found: list[tuple[str, Path]] = []
    bad: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for d in sorted(dirnames):
            if (here / d).is_symlink():
                _inside(root, here / d, local_dir)
                dirnames.remove(d)
        dirnames.sort()
        for f in sorted(filenames):
            path = here / f
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                target = _inside(root, path, local_dir)
                if not target.is_file():
                    continue
            elif not path.is_file():
                continue
            try:
                found.append((check_name(rel), path))
            except FetchError:
                bad.append(rel)
    if bad:
        shown = ", ".join(repr(b) for b in bad[:_NAMES_SHOWN]) + (" ..." if len(bad) > _NAMES_SHOWN else "")
        raise UploadError(f"local_dir: {len(bad)} file names in {str(local_dir)!r} cannot be uploaded "
                          f"({shown}): letters, digits, '_', '.', '-' and '/' only")
    if not found:
        raise UploadError(f"local_dir: {str(local_dir)!r} has no files to upload")
    return [LocalFile(rel, *_size_and_digest(path), path) for rel, path in sorted(found)]



def _inside(root: Path, link: Path, local_dir: str | os.PathLike[str]) -> Path:
    target = Path(os.path.realpath(link))
    if not target.is_relative_to(root) or not target.exists():
        rel = link.relative_to(root).as_posix()
        where = "outside it" if not target.is_relative_to(root) else "to nothing"
        raise UploadError(f"local_dir: {rel!r} in {str(local_dir)!r} is a symlink {where} ({target}): "
                          "refused; copy the file in, or remove the link")
    return target


def _size_and_digest(path: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


# ----------------------------------------------------------------------------- the claim


def claim_size(total_bytes: int) -> str:
    """The size of a claim made for ``total_bytes`` of files: 1.5 times the data (room for the temp
    file of a copy, and for more data later), rounded up to whole GiB, at least 1Gi."""
    return f"{max(1, math.ceil(total_bytes * 3 / 2 / GIB))}Gi"


def quantity_bytes(quantity: str | None) -> int | None:
    """A storage quantity ("5Gi", "500M") in bytes, or None when there is none or it is not one."""
    if not quantity:
        return None
    from kubernetes.utils.quantity import parse_quantity

    try:
        return int(parse_quantity(quantity))
    except (ValueError, TypeError, ArithmeticError):
        return None


def check_capacity(claim: str, capacity: str | None, total_bytes: int) -> None:
    """UploadError when the existing ``claim``'s capacity (when known) cannot hold ``total_bytes``."""
    have = quantity_bytes(capacity)
    if have is not None and have < total_bytes:
        raise UploadError(f"claim: {claim!r} holds {capacity} ({human_bytes(have)}), less than the "
                          f"{human_bytes(total_bytes)} to upload: use a larger claim or a new name "
                          f"(a new claim is made with {claim_size(total_bytes)})")


def claim_manifest(claim: str, total_bytes: int, access_modes: list[str],
                   storage_class: str | None = None) -> dict[str, Any]:
    """The claim upload makes when ``claim`` does not exist: claim_size of the data, on the cluster's
    default StorageClass unless ``storage_class`` is given."""
    pvc: dict[str, Any] = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "labels": {_api.LABEL_NAME: _api.APP_NAME, _api.LABEL_COMPONENT: "data",
                                               _api.LABEL_MANAGED_BY: _api.CLIENT_MANAGED_BY}},
        "spec": {"accessModes": list(access_modes),
                 "resources": {"requests": {"storage": claim_size(total_bytes)}}},
    }
    if storage_class:
        pvc["spec"]["storageClassName"] = storage_class
    return pvc


def data_access_modes(replicas: int) -> list[str]:
    """The operator's rule for claims (children.output_access_modes): ReadWriteMany when several pods
    mount it (they may run on several nodes), else ReadWriteOnce."""
    return ["ReadWriteMany"] if replicas > 1 else ["ReadWriteOnce"]


def pod_lifetime(total_bytes: int, files: int = 0) -> int:
    """The upload pod's activeDeadlineSeconds: 15 minutes, plus the data at 0.5 MB/s, plus 0.1 s a file
    (a tenth of what the batches measured: for a slow link and a slow disk), a day at most."""
    return min(86400, 900 + total_bytes // 500_000 + files // 10)


def upload_pod(claim: str, image: str, total_bytes: int,
               scheduling: dict[str, Any] | None = None, files: int = 0) -> dict[str, Any]:
    """The helper pod: the whole claim read-write at /data, as the trainer's uid and gid."""
    return helper_pod(owner=claim, component="upload", image=image, claim_name=claim, volume_name="data",
                      mount_path=UPLOAD_DIR, read_only=False, scheduling=scheduling,
                      labels={f"{_api.GROUP}/upload-to": claim}, lifetime_s=pod_lifetime(total_bytes, files))


# ----------------------------------------------------------------------------- the plan


def plan(files: list[LocalFile],
         listing: list[tuple[str, int, str]]) -> tuple[list[LocalFile], list[LocalFile]]:
    """(to copy, to skip): a file is skipped when the claim lists its name with the same size and sha256
    (listed twice with different contents, it is copied)."""
    there: dict[str, set[tuple[int, str]]] = {}
    for name, size, digest in listing:
        there.setdefault(name, set()).add((size, digest))
    skip = [f for f in files if there.get(f.name) == {(f.size, f.sha256)}]
    skipped = {f.name for f in skip}
    return [f for f in files if f.name not in skipped], skip
