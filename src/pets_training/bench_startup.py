"""``make bench-startup``: the trainer's start, from its process's start to its first training step, on a
Pets-sized folder (7,390 JPEGs of 500x375, 37 classes, written once under ``$PETS_CACHE``), three runs in a
row: without an input store, building the store, and with the store fresh. Each run's start-up is split by
what the trainer did (its summary's ``startup_parts``: imports, accelerator, data (the files' check, the
store), model, loaders and prepare, resume, first batch, first step). Prints a line a run, writes
``bench-startup.json`` and ``bench-startup.png`` (a bar a run, split into its parts).

    python -m pets_training.bench_startup [--files 7390] [--model resnet18] [--image-size 64] [--output DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from multiprocessing import Pool
from pathlib import Path
from typing import Any

CLASSES = 37
RUNS = ("no store", "building the store", "store fresh")


def _write(item: tuple[Path, int, str, int]) -> None:
    from PIL import Image

    from .synthetic import synthetic_image

    folder, index, name, label = item
    Image.fromarray(synthetic_image(42, index, label, CLASSES, 500)[:375]).save(folder / name, quality=90)


def pets_folder(cache: Path, files: int) -> Path:
    """``files`` JPEGs of 500x375 in the flat Pets layout (<Breed>_<n>.jpg), written once on every core."""
    from .synthetic import synthetic_samples

    folder = cache / f"bench-startup-pets-{files}"
    if not (folder / ".complete").exists():
        folder.mkdir(parents=True, exist_ok=True)
        samples = synthetic_samples(CLASSES, -(-files // CLASSES))[:files]
        print(f"writing {len(samples)} JPEGs of 500x375 to {folder}", flush=True)
        with Pool() as pool:
            items = [(folder, i, name, label) for i, (name, label) in enumerate(samples)]
            pool.map(_write, items, chunksize=64)
        (folder / ".complete").touch()
    return folder


def run_once(name: str, folder: Path, args: argparse.Namespace, output: Path) -> dict[str, Any]:
    """One trainer run to its first step (then the rest of the epoch's one step and the evaluation), from
    a process of its own, so its imports count; its summary's start-up and parts."""
    out = output / name.replace(" ", "-")
    shutil.rmtree(out, ignore_errors=True)
    store = ["--input-store", str(output / "store")] if name != "no store" else []
    cmd = [sys.executable, "-m", "pets_training", "--data", str(folder), "--model", args.model,
           "--image-size", str(args.image_size), "--batch-size", str(args.batch_size), "--no-pretrained",
           "--epochs", "1", "--max-train-steps", "1", "--no-checkpoints", "--no-tensorboard",
           "--output-dir", str(out), *store]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    (output / f"{out.name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}; log: {output / f'{out.name}.log'}\n"
                           f"{proc.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"startup_seconds": summary["time_seconds"]["startup"], "parts": summary["startup_parts"]}


def plot(runs: dict[str, dict[str, Any]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = list(dict.fromkeys(part for run in runs.values() for part in run["parts"]))
    fig, ax = plt.subplots(figsize=(9, 2.4 + 0.6 * len(runs)))
    left = [0.0] * len(runs)
    for part in parts:
        widths = [run["parts"].get(part, 0.0) for run in runs.values()]
        ax.barh(list(runs), widths, left=left, label=part)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for row, run in enumerate(runs.values()):
        ax.text(left[row], row, f" {run['startup_seconds']:.1f} s", va="center")
    ax.invert_yaxis()
    ax.set_xlim(0, 1.2 * max(left))
    ax.set(xlabel="seconds from the process's start to the first training step", title=title)
    ax.legend(ncol=4, fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.3))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pets_training.bench_startup",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=7390, help="JPEGs in the folder (default: 7390, Pets)")
    parser.add_argument("--model", default="resnet18",
                        help="(default: resnet18: what is measured is the start-up, not the model)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--output", default="bench-output", help="logs, bench-startup.json and .png")
    args = parser.parse_args(argv)
    if args.files < 2 * CLASSES:
        parser.error(f"--files must be at least {2 * CLASSES} (two of each of the {CLASSES} classes), got "
                     f"{args.files}")
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    cache = Path(os.environ.get("PETS_CACHE") or Path.home() / ".cache" / "pets-training")
    folder = pets_folder(cache, args.files)
    shutil.rmtree(output / "store", ignore_errors=True)  # the second run builds it, the third reads it
    runs: dict[str, dict[str, Any]] = {}
    for name in RUNS:
        runs[name] = run_once(name, folder, args, output)
        parts = ", ".join(f"{part} {seconds:.1f} s" for part, seconds in runs[name]["parts"].items())
        first = runs[name]["startup_seconds"]
        print(f"{name}: first step {first:.1f} s after the process's start ({parts})", flush=True)
    title = f"{args.files} JPEGs of 500x375, {args.model} at {args.image_size} px, {os.cpu_count()} CPUs"
    (output / "bench-startup.json").write_text(json.dumps(
        {"files": args.files, "model": args.model, "image_size": args.image_size, "runs": runs}, indent=1))
    plot(runs, title, output / "bench-startup.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
