"""``pets-train``: train (flags = settings, see ``pets-train --help``), or ``pets-train make-synthetic``.

Exit codes: 0 done (or stopped as asked), 2 bad input (config, data, model, weights), 1 anything else.
On failure the summary ``{"status": "failed", "error": ...}`` goes where the success summary would.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger("pets_training")


def make_synthetic(argv: Sequence[str]) -> int:
    from .data import write_synthetic

    parser = argparse.ArgumentParser(
        prog="pets-train make-synthetic",
        description="Write the deterministic synthetic pets set as <label>_<n>.jpg files.",
    )
    parser.add_argument("out", type=Path, help="directory to write (created if missing)")
    parser.add_argument("--classes", type=int, default=37, help="number of classes (default: 37)")
    parser.add_argument("--per-class", type=int, default=20, help="images per class (default: 20)")
    parser.add_argument("--size", type=int, default=256, help="image side in pixels (default: 256)")
    parser.add_argument("--seed", type=int, default=42, help="seed (default: 42)")
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality (default: 90)")
    args = parser.parse_args(list(argv))
    for name in ("classes", "per_class", "size"):
        if getattr(args, name) < (2 if name == "classes" else 1):
            parser.error(f"--{name.replace('_', '-')} is too small: {getattr(args, name)}")
    count = write_synthetic(args.out, args.classes, args.per_class, args.size, args.seed, args.quality)
    print(f"wrote {count} images to {args.out}")
    return 0


def _failure_paths(argv: Sequence[str]) -> list[Path | str | None]:
    """Where the failure summary goes, read leniently from the flags (the config may be what failed)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--summary-path")
    parser.add_argument("--output-dir")
    known, _ = parser.parse_known_args(list(argv))
    output = Path(known.output_dir or os.environ.get("PETS_OUTPUT_DIR") or "output")
    paths: list[Path | str | None] = [known.summary_path]
    if output.is_dir():
        paths.append(output / "summary.json")
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "make-synthetic":
        return make_synthetic(argv[1:])

    from .config import ConfigError, resolve
    from .data import DataError
    from .model import ModelError
    from .progress import write_summary
    from .train import setup_logging, training_function

    setup_logging()
    try:
        cfg = resolve(argv)
        training_function(cfg)
        return 0
    except (ConfigError, DataError, ModelError) as err:
        log.error("%s", err)
        code, message = 2, str(err)
    except Exception as err:
        log.exception("training failed")
        code, message = 1, f"{type(err).__name__}: {err}"
    if os.environ.get("LOCAL_RANK", "0") == "0":
        write_summary({"status": "failed", "error": message}, _failure_paths(argv))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
