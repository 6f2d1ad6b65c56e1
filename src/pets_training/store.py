"""The decoded store (``--input-store DIR``): every image of a file-backed set decoded once, as the CPU
path decodes it (``load_file_fast`` or ``load_file_pil``), into uint8 data files read through a memory map;
the workers then crop from memory instead of decoding. Crops are unchanged: the same decoded pixels go
through the same seeded transform.

There is one store per data directory (and decoder) under the ``--input-store`` directory. Its index
(``store.json``) names each source file with its size and mtime: when any differs, or the file list does,
the store is updated (one log line says which file): the new and changed files are decoded into a data
file of their own, and the others stay where they are. Past MAX_DATA_FILES data files, or when the images
still in use are under half of the old files' bytes, an update copies them into its new file too (with
their checksums, not decoded again). A store that does not match its own index (a data file of another
length, a checksum that differs) is refused with an error naming the store and what is wrong: delete the
directory to have it rebuilt. Files are written under temp names and renamed, index last, so a crash
leaves the old store or none.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import secrets
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from .data import DataError, PetsData, _FileLoader, _Subset, load_file_fast, load_file_pil

log = logging.getLogger(__name__)

STORE_VERSION = 2  # 2: several data files
INDEX = "store.json"
MAX_DATA_FILES = 4
DATA_NAME = re.compile(r"images-[0-9a-f]+\.u8")  # the only names the store reads or deletes


class StoreError(DataError):
    """The store does not match its own index: refused (exit 78); deleting it has it rebuilt."""


def _stat(paths: Sequence[Path]) -> list[list[Any]]:
    return [[str(path), (st := path.stat()).st_size, st.st_mtime_ns] for path in paths]


# an image of an earlier build: (its data file, offset, shape, CRC-32), by its source (path, size, mtime)
Kept = dict[tuple[Any, ...], tuple[str, int, list[int], int]]


def build_store(directory: Path, paths: Sequence[Path], fast: bool = True) -> tuple[int, int]:
    """Decode ``paths`` into ``directory`` (a data file, then the index that names it), keeping the images
    whose source is as the last build found it where they are, or copying them into the new data file
    (see the module's docstring). Returns (images decoded, images copied)."""
    directory.mkdir(parents=True, exist_ok=True)
    sources = _stat(paths)
    old = _read_index(directory)
    kept, old_bytes = _reusable(directory, old, fast)
    live = sum(math.prod(kept[key][2]) for key in map(tuple, sources) if key in kept)
    compact = 2 * live < sum(old_bytes.values()) or len(old_bytes) >= MAX_DATA_FILES
    data_name = f"images-{secrets.token_hex(6)}.u8"
    tmp = directory / f".{data_name}.tmp"
    entries: list[tuple[str, int, list[int], int]] = []
    decoded = copied = 0
    with tmp.open("wb") as out, contextlib.ExitStack() as opened:
        olds: dict[str, BinaryIO] = {}
        for path, source in zip(paths, sources, strict=True):
            found = kept.get(tuple(source))
            if found is not None and not compact:  # unchanged: it stays where it is
                entries.append(found)
                continue
            if found is not None:  # unchanged, copied with its checksum
                name, at, shape, crc = found
                if name not in olds:
                    olds[name] = opened.enter_context((directory / name).open("rb"))
                olds[name].seek(at)
                raw = olds[name].read(math.prod(shape))
                copied += 1
            else:
                image = (load_file_fast(path) if fast else load_file_pil(path)).contiguous()
                raw, shape = image.numpy().tobytes(), list(image.shape)
                crc = zlib.crc32(raw)
                decoded += 1
            entries.append((data_name, out.tell(), shape, crc))
            out.write(raw)
        written = out.tell()
    if written:
        tmp.replace(directory / data_name)
    else:  # nothing new: the update only dropped files
        tmp.unlink()
    names = list(dict.fromkeys(name for name, *_ in entries))
    sizes = {**old_bytes, data_name: written}
    position = {name: k for k, name in enumerate(names)}
    index = {"version": STORE_VERSION, "fast_decode": fast, "data": names, "bytes": [sizes[n] for n in names],
             "sources": sources, "data_file": [position[e[0]] for e in entries],
             "offsets": [e[1] for e in entries], "shapes": [e[2] for e in entries],
             "crc32": [e[3] for e in entries]}
    tmp_index = directory / f".{INDEX}.{secrets.token_hex(4)}.tmp"
    tmp_index.write_text(json.dumps(index))
    tmp_index.replace(directory / INDEX)
    for gone in set(_data_names(old)) - set(names):  # a process that maps one still reads it
        (directory / gone).unlink(missing_ok=True)
    return decoded, copied


def _data_names(index: dict[str, Any] | None) -> list[str]:
    """The data files an index names (a name that is not one the store writes is left alone)."""
    names = index.get("data") if index else None
    if isinstance(names, str):  # version 1: one data file
        names = [names]
    if not isinstance(names, list):
        return []
    return [n for n in names if isinstance(n, str) and DATA_NAME.fullmatch(n)]


def _reusable(directory: Path, index: dict[str, Any] | None, fast: bool) -> tuple[Kept, dict[str, int]]:
    """What an earlier build holds that a new one may keep, and its data files' lengths: only from a build
    of this version and decoder whose data files are whole."""
    if index is None:
        return {}, {}
    try:
        names, sizes = index["data"], index["bytes"]
        if (index["version"], index["fast_decode"]) != (STORE_VERSION, fast) or names != _data_names(index) \
                or any((directory / n).stat().st_size != size for n, size in zip(names, sizes, strict=True)):
            return {}, {}
        entries = zip(index["sources"], index["data_file"], index["offsets"], index["shapes"], index["crc32"],
                      strict=True)
        return {tuple(src): (names[k], at, shape, crc) for src, k, at, shape, crc in entries}, \
            dict(zip(names, sizes, strict=True))
    except (TypeError, KeyError, ValueError, IndexError, OSError):  # not an index to trust: decode everything
        return {}, {}


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
    names, sizes = index.get("data"), index.get("bytes")
    if names != _data_names(index) or not isinstance(sizes, list) or len(sizes) != len(names):
        raise StoreError(f"input store {str(directory)!r} is corrupt: its index {INDEX} does not name its "
                         "data files as this version writes them; delete the directory to have it rebuilt")
    for name, expected in zip(names, sizes, strict=True):
        data = directory / str(name)
        if not data.exists() or data.stat().st_size != expected:
            size = data.stat().st_size if data.exists() else "missing"
            raise StoreError(f"input store {str(directory)!r} is corrupt: its data file {data.name} holds "
                             f"{size} bytes, its index says {expected}; delete the directory to have it "
                             "rebuilt")
    return ""


class StoreLoader:
    """Picklable ``i -> uint8 CHW tensor`` from the store (each worker maps a data file on first use); an
    image whose checksum differs from the index is refused with a StoreError. ``paths``: its sources."""

    def __init__(self, directory: Path, index: dict[str, Any]):
        self.directory = directory
        self.data = [directory / name for name in index["data"]]
        self.paths = [Path(source[0]) for source in index["sources"]]
        self.data_file = index["data_file"]
        self.shapes = index["shapes"]
        self.offsets = index["offsets"]
        self.crcs = index["crc32"]
        self.maps: dict[int, np.memmap] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "maps": {}}

    def __call__(self, i: int) -> torch.Tensor:
        k = self.data_file[i]
        if k not in self.maps:
            self.maps[k] = np.memmap(self.data[k], dtype=np.uint8, mode="r")
        shape = self.shapes[i]
        raw = np.array(self.maps[k][self.offsets[i]: self.offsets[i] + int(np.prod(shape))])  # writable copy
        if zlib.crc32(raw.data) != self.crcs[i]:
            raise StoreError(f"input store {str(self.directory)!r} is corrupt: image {i} does not match its "
                             "checksum; delete the directory to have it rebuilt")
        return torch.from_numpy(raw).reshape(shape)


def store_directory(root: str, source: str, fast: bool) -> Path:
    """One store per data directory (``source``) and decoder under ``root``, named by a hash of them."""
    key = zlib.crc32(f"{fast}\n{source}".encode())
    return Path(root) / f"store-{key:08x}"


def use_store(data: PetsData, root: str, fast: bool = True, build: bool = True) -> str:
    """Read ``data``'s images (train and eval) from their store under ``root``, built first where it is
    missing or stale (``build``; else it must be fresh: another process built it). Returns the log line."""
    load_all = data.train.load.load_all if isinstance(data.train.load, _Subset) else None
    if not isinstance(load_all, _FileLoader):
        raise DataError("input store: the synthetic set has no files to store; drop --input-store")
    directory = store_directory(root, str(data.report["root"]), fast)
    why = why_stale(directory, load_all.paths, fast)
    if why and not build:
        raise StoreError(f"input store {str(directory)!r} is not ready ({why}) after the local main "
                         "process built it: is the directory shared by machines? give each its own")
    n = len(load_all.paths)
    line = f"input store {directory}: reusing it ({n} decoded images)"
    if why:
        decoded, copied = build_store(directory, load_all.paths, fast)
        done = f"{n} images decoded once" if decoded == n else f"{decoded} of {n} images decoded, the " + \
            (f"others copied into one data file ({copied})" if copied else "others kept")
        line = f"input store {directory}: {'building' if decoded == n else 'updating'} it ({why}): {done}"
    index = _read_index(directory)
    assert index is not None
    store = StoreLoader(directory, index)
    for images in (data.train, data.eval):
        assert isinstance(images.load, _Subset)
        images.load = _Subset(store, images.load.indices)
    return line
