"""The decoded store (``--input-store DIR``): every image of a file-backed set decoded once, as the CPU
path decodes it (``load_file_fast`` or ``load_file_pil``), into one uint8 file read through a memory map;
the workers then crop from memory instead of decoding. Crops are unchanged: the same decoded pixels go
through the same seeded transform.

The store's index (``store.json``) names each source file with its size and mtime: when any differs,
or the file list does, the store is rebuilt (one log line says which file). A store that does not
match its own index (a truncated data file, a checksum that differs) is refused with an error naming
the store and what is wrong: delete the directory to have it rebuilt. Files are written under temp names
and renamed, index last, so a crash leaves the old store or none.
"""

from __future__ import annotations

import json
import logging
import secrets
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .data import DataError, PetsData, _FileLoader, _Subset, load_file_fast, load_file_pil

log = logging.getLogger(__name__)

STORE_VERSION = 1
INDEX = "store.json"


class StoreError(DataError):
    """The store does not match its own index: refused (exit 78); deleting it has it rebuilt."""


def _stat(paths: Sequence[Path]) -> list[list[Any]]:
    return [[str(path), (st := path.stat()).st_size, st.st_mtime_ns] for path in paths]


def build_store(directory: Path, paths: Sequence[Path], fast: bool = True) -> None:
    """Decode ``paths`` into ``directory`` (data file, then the index that names it)."""
    directory.mkdir(parents=True, exist_ok=True)
    sources = _stat(paths)
    data_name = f"images-{secrets.token_hex(6)}.u8"
    tmp = directory / f".{data_name}.tmp"
    shapes: list[list[int]] = []
    offsets: list[int] = []
    crcs: list[int] = []
    offset = 0
    with tmp.open("wb") as out:
        for path in paths:
            image = (load_file_fast(path) if fast else load_file_pil(path)).contiguous()
            raw = image.numpy().tobytes()
            out.write(raw)
            shapes.append(list(image.shape))
            offsets.append(offset)
            crcs.append(zlib.crc32(raw))
            offset += len(raw)
    tmp.replace(directory / data_name)
    index = {"version": STORE_VERSION, "data": data_name, "bytes": offset, "fast_decode": fast,
             "sources": sources, "shapes": shapes, "offsets": offsets, "crc32": crcs}
    tmp_index = directory / f".{INDEX}.{secrets.token_hex(4)}.tmp"
    tmp_index.write_text(json.dumps(index))
    old = _read_index(directory)
    tmp_index.replace(directory / INDEX)
    if old and old.get("data") != data_name:
        (directory / str(old.get("data"))).unlink(missing_ok=True)


def _read_index(directory: Path) -> dict[str, Any] | None:
    path = directory / INDEX
    if not path.exists():
        return None
    try:
        index: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise StoreError(f"input store {str(directory)!r}: its index {INDEX} cannot be read ({err}); "
                         "delete the directory to have it rebuilt") from err
    return index


def why_stale(directory: Path, paths: Sequence[Path], fast: bool = True) -> str:
    """Why the store at ``directory`` cannot serve ``paths`` ("" when it can); raises StoreError when it
    is corrupt."""
    index = _read_index(directory)
    if index is None:
        return "there is none yet"
    built = (index.get("version"), index.get("fast_decode"))
    if built != (STORE_VERSION, fast):
        return f"it was built by another version or decoder {built}"
    sources = index.get("sources", [])
    if [s[0] for s in sources] != [str(p) for p in paths]:
        return "the set's files are not the ones it was built from"
    for (name, size, mtime), (_, new_size, new_mtime) in zip(sources, _stat(paths), strict=True):
        if (size, mtime) != (new_size, new_mtime):
            return f"{name} changed since it was built"
    data = directory / str(index.get("data"))
    if not data.exists() or data.stat().st_size != index.get("bytes"):
        size = data.stat().st_size if data.exists() else "missing"
        raise StoreError(f"input store {str(directory)!r} is corrupt: its data file {data.name} holds "
                         f"{size} bytes, its index says {index.get('bytes')}; delete the directory to have "
                         "it rebuilt")
    return ""


class StoreLoader:
    """Picklable ``i -> uint8 CHW tensor`` from the store (each worker maps the file on first use); an
    image whose checksum differs from the index is refused with a StoreError. ``paths``: its sources."""

    def __init__(self, directory: Path, index: dict[str, Any]):
        self.directory = directory
        self.data = directory / index["data"]
        self.paths = [Path(source[0]) for source in index["sources"]]
        self.shapes = index["shapes"]
        self.offsets = index["offsets"]
        self.crcs = index["crc32"]
        self.map: np.memmap | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "map": None}

    def __call__(self, i: int) -> torch.Tensor:
        if self.map is None:
            self.map = np.memmap(self.data, dtype=np.uint8, mode="r")
        shape = self.shapes[i]
        raw = np.array(self.map[self.offsets[i]: self.offsets[i] + int(np.prod(shape))])  # writable copy
        if zlib.crc32(raw.data) != self.crcs[i]:
            raise StoreError(f"input store {str(self.directory)!r} is corrupt: image {i} does not match its "
                             "checksum; delete the directory to have it rebuilt")
        return torch.from_numpy(raw).reshape(shape)


def store_directory(root: str, paths: Sequence[Path], fast: bool) -> Path:
    """One store per set of files (and decoder) under ``root``, named by a hash of their paths."""
    key = zlib.crc32("\n".join([str(fast), *map(str, paths)]).encode())
    return Path(root) / f"store-{key:08x}"


def use_store(data: PetsData, root: str, fast: bool = True, build: bool = True) -> str:
    """Read ``data``'s images (train and eval) from their store under ``root``, built first where it is
    missing or stale (``build``; else it must be fresh: another process built it). Returns the log line."""
    load_all = data.train.load.load_all if isinstance(data.train.load, _Subset) else None
    if not isinstance(load_all, _FileLoader):
        raise DataError("input store: the synthetic set has no files to store; drop --input-store")
    directory = store_directory(root, load_all.paths, fast)
    why = why_stale(directory, load_all.paths, fast)
    if why and not build:
        raise StoreError(f"input store {str(directory)!r} is not ready ({why}) after the local main "
                         "process built it: is the directory shared by machines? give each its own")
    line = f"input store {directory}: reusing it ({len(load_all.paths)} decoded images)"
    if why:
        line = f"input store {directory}: building it ({why}): {len(load_all.paths)} images decoded once"
        build_store(directory, load_all.paths, fast)
    index = _read_index(directory)
    assert index is not None
    store = StoreLoader(directory, index)
    for images in (data.train, data.eval):
        assert isinstance(images.load, _Subset)
        images.load = _Subset(store, images.load.indices)
    return line
