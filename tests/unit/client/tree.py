"""A directory tree as data, for the fetch tests: what a fetch may not change outside its destination."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every path under ``root`` (links not followed): its kind, its content or link target, its mode
    and its mtime in ns."""
    out: dict[str, tuple[Any, ...]] = {}
    for here, dirs, files in os.walk(root, followlinks=False):
        for entry in [*dirs, *files]:
            path = Path(here) / entry
            meta = path.lstat()
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path), meta.st_mtime_ns)
            elif path.is_dir():
                out[rel] = ("dir", meta.st_mode, meta.st_mtime_ns)
            else:
                out[rel] = ("file", path.read_bytes(), meta.st_mode, meta.st_mtime_ns)
    return out
