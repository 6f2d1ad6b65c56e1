"""``make bench``: six loops side by side, on the same synthetic JPEG files, the same model and batch, one
process each, in one process tree: the tutorial's loop as written (fp32), the tutorial's loop with the
mixed precision it asks for (``--mixed-precision``, fp16 as the tutorial's; bf16 on a CPU as our trainer
maps fp16 there, or skipped with a line where the CPU has no bf16 instructions), our trainer on its CPU
input path, on its device input path, and on the device input path reading its input store (images
decoded once, before the loop), and the model-only ceiling (our setup and training step, so our dtype and
cudnn setting, on one batch kept in memory: no data loading). Prints images/s of each with its ratio to
the tutorial as written and its share of the ceiling and, last, ``speedup: X.XXx`` (ours against the
tutorial as written). Throughput is measured over ``--steps`` training steps after ``--warmup`` steps
(data loading included: a step's time runs from the end of the previous step); each loop runs
``--repeats`` times, in a rotated order, and its best run counts (the machine may be shared). ``--cpus
N`` runs every loop's process tree on N cores (as a pod with a CPU limit of N: our trainer plans its
threads and workers from them).

    python -m pets_training.bench [--steps 4] [--warmup 1] [--model resnet50d] [--batch-size 64] [--cpus 4]
                                  [--mixed-precision fp16|bf16]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .synthetic import write_synthetic

CLASSES = 37


def throughput(step_times: list[float], step_images: list[int], warmup: int) -> float:
    """Images per second over the steps after ``warmup`` (each step timed from the end of the previous)."""
    if warmup < 1:
        raise ValueError(f"warmup must be at least 1 so the first timed step's start is known, got {warmup}")
    if len(step_times) < warmup + 1:
        raise ValueError(f"need more than {warmup} steps, got {len(step_times)}")
    seconds = step_times[-1] - step_times[warmup - 1]
    return sum(step_images[warmup:]) / seconds


def bench_data(cache: Path, images_needed: int, size: int) -> Path:
    """Synthetic JPEGs (37 classes), written once and reused from the cache."""
    per_class = math.ceil(images_needed / CLASSES)
    directory = cache / f"bench-jpegs-{CLASSES}x{per_class}-{size}px"
    marker = directory / ".complete"
    if not marker.exists():
        print(f"writing {CLASSES * per_class} synthetic JPEGs to {directory}", flush=True)
        write_synthetic(directory, CLASSES, per_class, size, seed=42)
        marker.touch()
    return directory


def _result(output: str) -> dict[str, Any]:
    for line in reversed(output.splitlines()):
        if line.startswith("RESULT "):
            data: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return data
    raise RuntimeError(f"no RESULT line in the output:\n{output[-4000:]}")


def _run(cmd: list[str], log_path: Path) -> dict[str, Any]:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log_path.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} exited {proc.returncode}; log: {log_path}\n{proc.stderr[-4000:]}"
        )
    return _result(proc.stdout)


def _our_config(args: argparse.Namespace) -> Any:
    from .config import resolve

    return resolve(
        ["--data", args.data, "--model", args.model, "--image-size", str(args.image_size),
         "--batch-size", str(args.batch_size), "--max-train-steps", str(args.warmup + args.steps),
         "--output-dir", str(Path(args.output) / "ours"), "--no-checkpoints",
         "--mixed-precision", args.mixed_precision, "--no-pretrained", "--input-path", args.input_path,
         *(["--input-store", args.input_store] if args.input_store else [])]  # random init: the same work
    )  # fmt: skip


def worker(args: argparse.Namespace) -> int:
    """Our trainer, in this process: the real training_function with a step limit and a timing hook."""
    from .train import training_function

    times: list[float] = []
    images: list[int] = []

    def hook(step: int, n: int) -> None:
        times.append(time.perf_counter())
        images.append(n)

    summary = training_function(_our_config(args), step_hook=hook) or {}
    parts = summary.get("time_seconds") or {}
    # the share of its steps' time the loop waited for the next batch: is the input pipeline the bound?
    waited = parts["train_input_wait"] / parts["train"] if parts.get("train") else None
    print("RESULT " + json.dumps({"step_times": times, "step_images": images, "input_wait_share": waited}),
          flush=True)
    return 0


def ceiling_worker(args: argparse.Namespace) -> int:
    """The model-only ceiling: our setup and our train_step, repeated on one batch already in memory."""
    from .contract import PodContract, ProcessContext
    from .train import setup, train_step

    t = setup(_our_config(args), PodContract.from_env(os.environ), ProcessContext.from_env(os.environ))
    t.module.train()
    images, labels = t.make_batch(next(iter(t.train_loader)))  # decoded and on the device once, then reused
    times: list[float] = []
    counts: list[int] = []
    for _ in range(args.warmup + args.steps):
        train_step(t, images, labels).item()  # .item() waits for the step, as the data loop would
        times.append(time.perf_counter())
        counts.append(labels.shape[0] * t.accelerator.num_processes)
    print("RESULT " + json.dumps({"step_times": times, "step_images": counts}), flush=True)
    return 0


# name -> what it is, printed beside its images/s
LOOPS = {
    "tutorial": "tutorial loop as written (fp32, PIL + ToTensor, autograd through the frozen backbone)",
    "tutorial-mp": "tutorial loop with its mixed precision ({precision})",
    "ours": "ours (pets-train: {precision} autocast, channels_last, no-grad frozen backbone, uint8 batches, "
            "decode and crop on the CPU, quota-sized threads and workers)",
    "ours-device": "ours on the device input path (workers read files; decode and crop on the {device})",
    "ours-store": "ours on the device input path from its input store (decoded once; crop on the {device})",
    "ceiling": "model-only ceiling (our step on one batch in memory, no data loading)",
}


def report(ips: dict[str, float], precision: str, device: str = "cpu") -> list[str]:
    """The lines `make bench` prints: each loop's images/s, its ratio to the tutorial as written and its
    share of the ceiling (our setup: our dtype and cudnn setting)."""
    base, ceiling = ips["tutorial"], ips["ceiling"]
    lines = [f"{LOOPS[name].format(precision=precision, device=device)}: {value:.2f} images/s "
             f"({value / base:.2f}x, {100 * value / ceiling:.0f} % of the ceiling)"
             for name, value in ips.items()]
    lines.append(f"ours at {100 * ips['ours'] / ceiling:.0f} % of the model-only ceiling")
    lines.append(f"speedup: {ips['ours'] / base:.2f}x")
    return lines


def plot_bench(runs: dict[str, list[float]], title: str, path: Path) -> None:
    """The loops side by side as a PNG: a bar at each loop's best run, a dot at every run, and beside
    the bar its images/s and share of the ceiling; the ceiling's own bar is grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(runs)
    best = [max(runs[name]) for name in names]
    ceiling = max(runs["ceiling"])
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.55 * len(names)))
    colours = ["tab:grey" if n == "ceiling" else "tab:green" if n.startswith("ours") else "tab:blue"
               for n in names]  # fmt: skip
    bars = ax.barh(names, best, color=colours, alpha=0.8)
    for row, name in enumerate(names):
        ax.plot(runs[name], [row] * len(runs[name]), "k.", markersize=5)
    ax.bar_label(bars, labels=[f"{v:.1f} images/s, {100 * v / ceiling:.0f} %" for v in best], padding=8)
    ax.axvline(ceiling, color="tab:grey", linestyle="--", linewidth=1)
    ax.invert_yaxis()  # in the order they ran: the tutorial first, the ceiling last
    ax.set_xlim(0, 1.45 * max(max(v) for v in runs.values()))
    ax.set(xlabel="images/s (bar: best run; dots: every run; %: of the model-only ceiling)", title=title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def tutorial_precision(on_gpu: bool, asked: str = "fp16") -> tuple[str | None, str]:
    """The tutorial's `--mixed_precision` (``asked``) as our trainer maps it (None: the loop is skipped:
    on a CPU without bf16 instructions, where bf16 is emulated), and why."""
    from .model import cpu_runs_bf16_natively, resolve_precision

    if asked == "no":
        return None, "tutorial-mp: skipped: no mixed precision asked for, which is the tutorial as written"
    cpu_bf16 = on_gpu or cpu_runs_bf16_natively()
    precision = resolve_precision(asked, on_gpu, cpu_bf16)
    if precision.mixed_precision == "no" or (precision.mixed_precision == "bf16" and not cpu_bf16):
        return None, ("tutorial-mp: skipped: this CPU has no bf16 instructions (AVX-512 BF16 or AMX), "
                      "where torch emulates bf16 (one step took over 3 min); the loops run without mixed "
                      "precision here, as our trainer runs the tutorial's fp16: the tutorial as written")
    return precision.mixed_precision, f"tutorial-mp: {precision.mixed_precision}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pets_training.bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--steps", type=int, default=4, help="timed training steps per loop (default: 4)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (default: 1)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each loop, best kept (default: 2)")
    parser.add_argument("--model", default="resnet50d")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--jpeg-size", type=int, default=320, help="side of the synthetic JPEGs (default: 320)"
    )
    parser.add_argument("--data", help="use this image directory instead of the cached synthetic JPEGs")
    parser.add_argument(
        "--output", default="bench-output", help="logs, bench.json, bench.png (default: bench-output)"
    )
    parser.add_argument("--cpus", type=int, help="run every loop on this many cores (default: all)")
    parser.add_argument("--mixed-precision", choices=["no", "fp16", "bf16"], default="fp16",
                        help="the tutorial's mixed precision, and ours (default: fp16, the tutorial's)")
    parser.add_argument("--input-path", default="cpu", help=argparse.SUPPRESS)
    parser.add_argument("--input-store", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ceiling", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.steps, args.warmup, args.repeats) < 1:
        parser.error(f"--steps, --warmup and --repeats must be at least 1, got {args.steps}, {args.warmup}, "
                     f"{args.repeats}")  # fmt: skip
    if args.worker:
        return worker(args)
    if args.ceiling:
        return ceiling_worker(args)

    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    steps = args.warmup + args.steps
    if args.data is None:
        cache = Path(os.environ.get("PETS_CACHE") or Path.home() / ".cache" / "pets-training")
        # the training split (80 %) must hold all the steps' images in one epoch
        args.data = str(bench_data(cache, math.ceil(steps * args.batch_size / 0.8) + CLASSES, args.jpeg_size))
    common = ["--data", args.data, "--model", args.model, "--image-size", str(args.image_size),
              "--batch-size", str(args.batch_size)]  # fmt: skip
    print(f"bench: {args.model}, batch {args.batch_size}, {args.image_size} px, {args.warmup} warm-up + "
          f"{args.steps} timed steps, images from {args.data}", flush=True)  # fmt: skip

    import torch

    on_gpu = torch.cuda.is_available()
    available = sorted(os.sched_getaffinity(0))
    if args.cpus is not None and not 1 <= args.cpus <= len(available):
        parser.error(f"--cpus must be 1 to {len(available)} (the cores this process may use), "
                     f"got {args.cpus}")
    cpus = set(available[:args.cpus]) if args.cpus else None
    if cpus:  # this process only waits: the loops and their workers inherit it (no preexec_fn after threads)
        os.sched_setaffinity(0, cpus)
    # the tutorial's `accelerate launch --mixed_precision fp16`: fp16 on a GPU; on a CPU as ours maps it
    mixed, precision_line = tutorial_precision(on_gpu, args.mixed_precision)
    print(precision_line + (f"; every loop on {args.cpus} core(s)" if cpus else ""), flush=True)
    base_cmd = [sys.executable, "-m", "pets_training.baseline", *common, "--steps", str(steps), "--no-eval"]
    ours_cmd = [sys.executable, "-m", "pets_training.bench", *common, "--steps", str(args.steps),
                "--warmup", str(args.warmup), "--output", str(output),
                "--mixed-precision", mixed or "no"]  # fmt: skip
    commands = {"tutorial": base_cmd}
    skipped: dict[str, str] = {}  # loop -> why it did not run, in bench.json beside those that did
    if mixed is not None:
        commands["tutorial-mp"] = [*base_cmd, "--mixed-precision", mixed]
    else:
        skipped["tutorial-mp"] = precision_line.removeprefix("tutorial-mp: skipped: ")
    commands["ours"] = [*ours_cmd, "--worker"]
    commands["ours-device"] = [*ours_cmd, "--worker", "--input-path", "device"]
    # its store built by the first run, before its timed steps; reused by the repeats
    commands["ours-store"] = [*commands["ours-device"], "--input-store", str(output / "store")]
    commands["ceiling"] = [*ours_cmd, "--ceiling"]
    precision = mixed or "no"
    runs: dict[str, list[float]] = {name: [] for name in commands}
    waits: dict[str, list[float | None]] = {name: [] for name in commands}  # our loops' input wait shares
    names = list(commands)
    # this machine may be shared: rotate the order and keep each loop's best (least disturbed) run
    for repeat in range(args.repeats):
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:
            result = _run(commands[name], output / f"{name}-{repeat + 1}.log")
            runs[name].append(throughput(result["step_times"], result["step_images"], args.warmup))
            waits[name].append(result.get("input_wait_share"))
            print(f"  {name} run {repeat + 1}: {runs[name][-1]:.2f} images/s", flush=True)
    ips = {name: max(values) for name, values in runs.items()}
    # each of our loops' best run: the share of its training time it waited for input
    input_wait = {name: waits[name][runs[name].index(ips[name])]
                  for name in ("ours", "ours-device", "ours-store")}
    lines = report(ips, precision, "GPU" if on_gpu else "CPU")
    (output / "bench.json").write_text(json.dumps({
        "model": args.model, "batch_size": args.batch_size, "image_size": args.image_size,
        "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats, "runs": runs,
        "mixed_precision": precision, "cpus": args.cpus, "cudnn_benchmark": on_gpu,
        "ours_of_ceiling_by_loop": {name: round(value / ips["ceiling"], 3) for name, value in ips.items()},
        "images_per_second": {name: round(value, 3) for name, value in ips.items()},
        "baseline_images_per_second": round(ips["tutorial"], 3),
        "ours_images_per_second": round(ips["ours"], 3),
        "ours_of_ceiling": round(ips["ours"] / ips["ceiling"], 3),
        "speedup": round(ips["ours"] / ips["tutorial"], 3),
        "input_wait_share": {name: None if v is None else round(v, 3) for name, v in input_wait.items()},
        "loops": names, "skipped": skipped, "lines": lines,
    }, indent=1))  # fmt: skip
    where = f"on {args.cpus} core(s)" if cpus else f"on all {len(available)} cores"
    plot_bench(runs, f"{args.model}, batch {args.batch_size}, {args.image_size} px, {precision}, "
                     f"{'GPU' if on_gpu else 'CPU'}, input {where}", output / "bench.png")
    print("waiting for input, share of the training time: " + ", ".join(
        f"{name} {'-' if v is None else f'{100 * v:.0f} %'}" for name, v in input_wait.items()), flush=True)
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
