"""The check of every image at start, and the index of what it found, so a run opens only what changed.

An image is checked by a reduced-size decode with PIL (:func:`check_image`: cheap, but it reads the whole
JPEG stream, so a truncated file is caught). What the check found is kept in an index in a directory the
trainer writes (the caller chooses it: beside the input store, or the output directory; never the data
directory, which is often read-only), named by a hash of the data root::

    image-checks-<crc32 of the root>.json
    {"version": 1, "checker": "PIL <version>, draft 64x64", "root": "/data/images",
     "files": {"beagle_1.jpg": {"size": 51234, "mtime_ns": 1732..., "width": 500, "height": 375},
               "pug_2.jpg": {"size": 17, "mtime_ns": 1732..., "error": "UnidentifiedImageError: ..."}}}

A file whose relative name, size and mtime_ns are in the index is not opened: its result is read. A new
or changed file is checked alone. A rewrite that keeps both the size and the mtime_ns is not seen (as
rsync's quick check); such a file that no longer decodes stops the run later, naming it. An index of
another version, checker or root, or one that does not parse as this format, is ignored and rebuilt.
It is written whole under a temp name and renamed, and only by the process the caller allows (the local
main process): the others read it and check what it lacks themselves.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import PIL
from PIL import Image

log = logging.getLogger(__name__)

INDEX_VERSION = 1
CHECKER = f"PIL {PIL.__version__}, draft 64x64"  # another check may find otherwise: its index is not ours


@dataclass(frozen=True)
class Checked:
    """One file as checked: its size and mtime_ns then, and the image's (width, height) or why it failed."""

    size: int
    mtime_ns: int
    dims: tuple[int, int] | None = None
    error: str | None = None


def check_image(path: Path) -> tuple[int, int] | str:
    """The image's (width, height) when it decodes, else why not. Decodes JPEGs at reduced size."""
    try:
        with Image.open(path) as img:
            dims = img.size
            img.draft("RGB", (64, 64))
            img.load()
    except Exception as err:  # PIL raises many kinds for bad files
        return f"{type(err).__name__}: {err}"
    return dims


def index_path(directory: Path, root: Path) -> Path:
    return directory / f"image-checks-{zlib.crc32(str(root).encode()):08x}.json"


def _entry(raw: Any) -> Checked | None:
    """An index entry, or None when it is not one this version writes."""
    if not isinstance(raw, dict) or type(raw.get("size")) is not int or type(raw.get("mtime_ns")) is not int:
        return None
    if set(raw) == {"size", "mtime_ns", "error"} and isinstance(raw["error"], str):
        return Checked(raw["size"], raw["mtime_ns"], error=raw["error"])
    if set(raw) == {"size", "mtime_ns", "width", "height"} and \
            type(raw["width"]) is int and type(raw["height"]) is int:
        return Checked(raw["size"], raw["mtime_ns"], dims=(raw["width"], raw["height"]))
    return None


def read_index(path: Path, root: Path) -> tuple[dict[str, Checked], str]:
    """The index's entries by relative name, and why it was ignored ("" when it was not)."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}, "there is none yet"
    except (OSError, ValueError) as err:
        return {}, f"it cannot be read: {type(err).__name__}"
    if not isinstance(raw, dict) or not isinstance(raw.get("files"), dict):
        return {}, "it is not an index of image checks"
    if (raw.get("version"), raw.get("checker"), raw.get("root")) != (INDEX_VERSION, CHECKER, str(root)):
        return {}, "it was written by another version, checker or data root"
    entries = {name: _entry(value) for name, value in raw["files"].items()}
    if not all(isinstance(name, str) and entry for name, entry in entries.items()):
        return {}, "it holds entries of another format"
    return {name: entry for name, entry in entries.items() if entry}, ""


def write_index(path: Path, root: Path, entries: dict[str, Checked]) -> None:
    """The index, written whole: a temp name of this writer's own, then a rename."""
    files: dict[str, dict[str, Any]] = {}
    for name, c in entries.items():
        result = {"error": c.error} if c.dims is None else {"width": c.dims[0], "height": c.dims[1]}
        files[name] = {"size": c.size, "mtime_ns": c.mtime_ns, **result}
    body = {"version": INDEX_VERSION, "checker": CHECKER, "root": str(root), "files": files}
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(body, separators=(",", ":")))
        tmp.replace(path)
    except OSError as err:  # an optimisation only: the next run checks again
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        log.warning("image checks: the index %s could not be written (%s); the next run checks again",
                    path, err)


@dataclass
class CheckResult:
    ok: list[Path]  # the images that decode, in the order given
    unreadable: list[tuple[Path, str]]  # each other one, with why
    opened: int  # the files this run opened
    line: str  # for the log


def check_images(root: Path, paths: Sequence[Path], index_dir: Path | None = None,
                 write: bool = True) -> CheckResult:
    """Check ``paths`` (files under ``root``), opening only those the index in ``index_dir`` does not hold
    as they are now, and rewrite the index when anything differs and ``write``. Without ``index_dir``, every
    file is opened and no index kept."""
    where = index_path(index_dir, root) if index_dir is not None else None
    known, ignored = read_index(where, root) if where is not None else ({}, "none is kept")
    entries: dict[str, Checked] = {}
    ok: list[Path] = []
    unreadable: list[tuple[Path, str]] = []
    opened = 0
    prefix = os.path.join(str(root), "")
    for path in paths:
        text = str(path)  # its name under root, without pathlib's cost per file
        name = text[len(prefix):] if text.startswith(prefix) else path.relative_to(root).as_posix()
        try:
            st = path.stat()  # before the check: a change during it shows at the next run
        except OSError as err:  # gone since the listing: left out of the index
            unreadable.append((path, f"unreadable ({type(err).__name__}: {err})"))
            continue
        entry = known.get(name)
        if entry is None or (entry.size, entry.mtime_ns) != (st.st_size, st.st_mtime_ns):
            opened += 1
            found = check_image(path)
            entry = Checked(st.st_size, st.st_mtime_ns, error=found) if isinstance(found, str) else \
                Checked(st.st_size, st.st_mtime_ns, dims=found)
        entries[name] = entry
        if entry.error is None:
            ok.append(path)
        else:
            unreadable.append((path, f"unreadable ({entry.error})"))
    if where is not None and write and entries != known:
        write_index(where, root, entries)
    if where is None:
        line = f"checked {opened} images (no index of checks kept)"
    elif ignored:
        line = f"checked {opened} of {len(paths)} images; the index {where} was not used ({ignored})"
    else:
        line = f"checked {opened} of {len(paths)} images (new or changed); the others as the index {where} " \
            "has them"
    return CheckResult(ok, unreadable, opened, line)
