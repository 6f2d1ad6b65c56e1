"""``make bench-preempt``: what one preemption costs a training, with epoch-only checkpoints (the behaviour
before step checkpoints) against step checkpoints, side by side, and the stall each save causes (issue 22).

One training configuration (default: resnet18 at 64 px, random init, 16 synthetic classes x 400 images,
batch 32, 3 epochs: 160 steps per epoch) runs in three scenarios, each in a fresh output directory:

1. ``epoch-kill``: epoch checkpoints only (``--checkpoint-interval-seconds 0``), ended by SIGKILL. Before
   step checkpoints a SIGTERM ended the run without saving, so for the work lost it was the same as a kill.
2. ``step-kill``: a step checkpoint every ``--interval`` seconds, ended by SIGKILL (a node lost, no notice).
3. ``step-term``: the same, ended by SIGTERM (an eviction or a preemption with notice): the trainer finishes
   its step, saves a step checkpoint and exits 75 (checked).
4. ``resize-term``: a resize, as the operator drives one: 2 processes (``pets-launch`` with
   ``PETS_PROCS_PER_MACHINE=2``) ended by SIGTERM, resumed on 1 process (gradient accumulation 2) from the
   next sample. Its lost seconds are the seconds lost per resize.

Each scenario starts the trainer (``python -m pets_training``, one process) with ``--metrics-port``, polls
``pets_step`` on it until the preemption point (``--preempt-at``, in epochs from the start: 1.7 is 70 % into
the second epoch), sends the signal, times the signal -> process exit, then runs the same command again with
``--resume`` to the end and reads where it resumed (``resume_step``) and its restore time
(``time_seconds.restore``) from its summary. Per scenario:

- lost steps = the last ``pets_step`` read before the signal - the step the resumed run began at. A lower
  bound: the trainer may finish a step or two between that read and the signal (for the SIGTERM scenario
  it saves after the step it is on, so nothing is lost and this is 0);
- seconds per step = the first run's ``pets_train_seconds_total`` / its steps after the first (that gauge
  counts from the end of the first step, without eval and saves), at the last read;
- lost seconds per preemption = lost steps x seconds per step + the stopping time (signal -> exit, less
  the steps finished in it that the SIGTERM save kept: they are work, not loss; what remains is the save
  and the shutdown) + the resumed run's restore. The restarted process's start-up
  is about the same in every scenario and is not counted (the table shows the resumed run's ``startup``
  part: setup and its first step, without Python's imports, the restore set apart);
- the stall: each save's ``training blocked X s`` from the trainer's log (both runs), median and max of the
  step saves by time, the SIGTERM save on its own, the epoch saves, and the share of training time spent
  saving (``pets_checkpoint_seconds_total`` / ``pets_train_seconds_total``, the first run's at its last read
  plus the resumed run's from its summary).

Prints the table, writes ``<output>/bench-preempt.json`` (the runs' logs stay in
``<output>/bench-preempt/<scenario>/``; their checkpoints are removed unless ``--keep-checkpoints``) and ends
with ``lost per preemption: epoch-only X s, step checkpoints (no notice) Y s, SIGTERM save Z s``.

    python -m pets_training.bench_preempt [--model resnet18] [--image-size 64] [--epochs 3] [--interval 5]
        [--preempt-at 1.7] [--trainer-args="--threads 1"]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pets_contract import env, exits, gauges
from pets_contract import summary as summary_keys

STEP, STEPS_TOTAL, TRAIN_SECONDS, RESUME_STEP = (
    gauges.BY_KEY[key].name for key in ("step", "steps_total", "train_seconds_total", "resume_step"))


@dataclass(frozen=True)
class Scenario:
    key: str
    label: str  # the table's column head
    step_checkpoints: bool  # False: --checkpoint-interval-seconds 0 (epoch checkpoints only)
    signal: int
    processes: int = 1  # of the first run; the resumed run has 1 (more: a resize)


SCENARIOS = (
    Scenario("epoch-kill", "epoch ckpts only, killed", False, signal.SIGKILL),
    Scenario("step-kill", "step ckpts, killed", True, signal.SIGKILL),
    Scenario("step-term", "step ckpts, SIGTERM", True, signal.SIGTERM),
    Scenario("resize-term", "resized 2 -> 1, SIGTERM", True, signal.SIGTERM, processes=2),
)

# saves.save_checkpoint's log line
SAVE_LINE = re.compile(
    r"checkpoint (?P<name>\S+) saved \(global step (?P<step>\d+)\): "
    r"training blocked (?P<blocked>\d+(?:\.\d+)?) s"
)
STEP_CHECKPOINT = re.compile(r"epoch_\d+_step_\d+")


@dataclass(frozen=True)
class Save:
    name: str
    global_step: int
    blocked: float  # seconds, as logged (2 decimals)

    @property
    def is_step(self) -> bool:
        return STEP_CHECKPOINT.fullmatch(self.name) is not None


def parse_saves(log_text: str) -> list[Save]:
    """Every checkpoint save the trainer logged, in order."""
    return [Save(m["name"], int(m["step"]), float(m["blocked"])) for m in SAVE_LINE.finditer(log_text)]


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {name: value} for the samples without labels (the trainer's gauges),
    read by prometheus_client's own parser (the trainer serves the page with that library)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if not sample.labels}


def target_step(steps_total: int, epochs: int, preempt_at: float) -> int:
    """The global step to preempt at: ``preempt_at`` epochs from the start (1.7: 70 % into epoch 2)."""
    if epochs < 1 or steps_total % epochs:
        raise ValueError(f"{steps_total} steps do not split into {epochs} epochs")
    if not 0 < preempt_at < epochs:
        raise ValueError(f"the preemption point must lie inside the run (0 < at < {epochs}), "
                         f"got {preempt_at}")
    step = round(preempt_at * steps_total / epochs)
    if not 1 < step < steps_total:
        raise ValueError(f"preempting at {preempt_at} epochs is step {step} of {steps_total}: "
                         "too close to an end")
    return step


def seconds_per_step(train_seconds: float, step: float, resume_step: float = 0) -> float:
    """From the ``pets_train_seconds_total`` and ``pets_step`` gauges read together: the train part counts
    from the end of the run's first step, so it holds the steps after the first."""
    timed = step - resume_step - 1
    if timed < 1 or train_seconds <= 0:
        raise ValueError(f"no timed steps to go by (step {step}, resumed at {resume_step}, "
                         f"{train_seconds} s)")
    return train_seconds / timed


def preemption_cost(
    last_read_step: int, resume_step: int, step_seconds: float, exit_seconds: float, restore_seconds: float
) -> dict[str, float]:
    """The seconds one preemption cost: the work redone (a lower bound, see the module's doc), the
    signal -> exit less the steps finished in it that the SIGTERM save kept (work, not loss), and the
    resumed run's restore."""
    lost_steps = max(0, last_read_step - resume_step)
    lost_work = lost_steps * step_seconds
    kept = max(0, resume_step - last_read_step) * step_seconds
    stopping = max(0.0, exit_seconds - kept)
    return {
        "lost_steps": lost_steps,
        "lost_work_seconds": lost_work,
        "exit_seconds": exit_seconds,
        "stopping_seconds": stopping,
        "restore_seconds": restore_seconds,
        "lost_seconds": lost_work + stopping + restore_seconds,
    }


def save_stats(blocked: Sequence[float]) -> dict[str, float] | None:
    """Median, max, count and total of the seconds each save blocked training; None without saves."""
    if not blocked:
        return None
    return {"count": len(blocked), "median": statistics.median(blocked), "max": max(blocked),
            "total": sum(blocked)}  # fmt: skip


def checkpoint_share(checkpoint_seconds: float, train_seconds: float) -> float:
    """Seconds saving per second of training: ``pets_checkpoint_seconds_total`` over
    ``pets_train_seconds_total``."""
    return checkpoint_seconds / train_seconds if train_seconds > 0 else 0.0


def _stats_cell(stats: dict[str, float] | None) -> str:
    return f"{stats['median']:.2f} / {stats['max']:.2f} ({stats['count']:g})" if stats else "-"


# the table's rows: label -> the cell of one scenario's result
ROWS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("step checkpoint every", lambda r: f"{r['interval_seconds']:g} s" if r["interval_seconds"] else "off"),
    ("signal, exit code", lambda r: f"{r['signal']}, {r['exit_code']}"),
    ("preempted at step (last read)", lambda r: f"{r['last_read_step']} of {r['steps_total']}"),
    ("resumed at step", lambda r: f"{r['resume_step']}"),
    ("lost steps (lower bound)", lambda r: f"{r['lost_steps']}"),
    ("seconds per step", lambda r: f"{r['seconds_per_step']:.3f}"),
    ("lost work s", lambda r: f"{r['lost_work_seconds']:.2f}"),
    ("signal -> exit s", lambda r: f"{r['exit_seconds']:.2f}"),
    ("  of it stopping (not steps kept) s", lambda r: f"{r['stopping_seconds']:.2f}"),
    ("restore s", lambda r: f"{r['restore_seconds']:.2f}"),
    ("LOST PER PREEMPTION s", lambda r: f"{r['lost_seconds']:.2f}"),
    ("resumed run's startup part s", lambda r: f"{r['resumed_startup_seconds']:.2f}"),
    ("step saves: median / max s (n)", lambda r: _stats_cell(r["step_saves"])),
    ("SIGTERM save blocked s", lambda r: "-" if r["sigterm_save"] is None else f"{r['sigterm_save']:.2f}"),
    ("epoch saves: median / max s (n)", lambda r: _stats_cell(r["epoch_saves"])),
    ("saving / training time", lambda r: f"{100 * r['checkpoint_share']:.1f} %"),
]


def table(results: Sequence[dict[str, Any]]) -> list[str]:
    """The scenarios side by side: one column each, one row per quantity."""
    head = ["", *(r["label"] for r in results)]
    rows = [head, *([label, *(cell(r) for r in results)] for label, cell in ROWS)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = []
    for row in rows:
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs]
        lines.append("  ".join(cells).rstrip())
    return lines


def final_line(results: Sequence[dict[str, Any]]) -> str:
    lost = {r["key"]: r["lost_seconds"] for r in results}
    resize = f"; per resize 2 -> 1 {lost['resize-term']:.2f} s" if "resize-term" in lost else ""
    return (f"lost per preemption: epoch-only {lost['epoch-kill']:.2f} s, step checkpoints (no notice) "
            f"{lost['step-kill']:.2f} s, SIGTERM save {lost['step-term']:.2f} s{resize}")  # fmt: skip


# ---------------------------------------------------------------- the driver (processes)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        return parse_metrics(response.read().decode())


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def _child_env(processes: int = 1) -> dict[str, str]:
    # the launcher's and the operator's variables would change what the trainer does
    kept = {k: v for k, v in os.environ.items() if k not in (env.EXIT_CODE_FILE, env.ATTEMPT)}
    return {**kept, env.PROCS_PER_MACHINE: str(processes)} if processes > 1 else kept


def _preempt_run(
    cmd: list[str], log_path: Path, port: int, epochs: int, preempt_at: float, sig: int, timeout: float,
    poll: float, processes: int = 1,
) -> dict[str, Any]:
    """Start the trainer, poll its gauges until the preemption point, signal it, wait for its exit."""
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=_child_env(processes))
        try:
            deadline = time.monotonic() + timeout
            last: dict[str, float] = {}
            target: int | None = None
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the trainer exited {proc.returncode} before the preemption point "
                                       f"(step {target}, last read {last.get('pets_step')}); "
                                       f"log {log_path}:\n{_tail(log_path)}")  # fmt: skip
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no preemption point within {timeout:g} s (last read {last}); log "
                                       f"{log_path}:\n{_tail(log_path)}")  # fmt: skip
                try:
                    metrics = _scrape(port)
                except OSError:  # not serving yet
                    metrics = {}
                if STEP in metrics and STEPS_TOTAL in metrics:
                    last = metrics
                    if target is None:
                        target = target_step(int(metrics[STEPS_TOTAL]), epochs, preempt_at)
                    if metrics[STEP] >= target:
                        break
                time.sleep(poll)
            signalled = time.monotonic()
            proc.send_signal(sig)
            code = proc.wait(timeout=max(60.0, deadline - time.monotonic()))
            exit_seconds = time.monotonic() - signalled
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {"metrics": last, "target_step": target, "exit_code": code, "exit_seconds": exit_seconds}


def run_scenario(
    scenario: Scenario, args: argparse.Namespace, common: list[str], root: Path
) -> dict[str, Any]:
    """One scenario: the run preempted, then resumed to the end; the result row (see the module's doc)."""
    out = root / scenario.key
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    interval = args.interval if scenario.step_checkpoints else 0.0
    flags = [*common, "--output-dir", str(out), "--checkpoint-interval-seconds", f"{interval:g}"]
    cmd = [sys.executable, "-m", "pets_training", *flags]
    # several processes: the pod's launcher, which forwards SIGTERM to every rank and exits 75 when all did
    first_cmd = cmd if scenario.processes == 1 else [str(Path(sys.executable).parent / "pets-launch"), *flags]
    port = _free_port()
    started = time.monotonic()
    first = _preempt_run(
        [*first_cmd, "--metrics-port", str(port), "--summary-path", str(out / "termination-log.json")],
        out / "first.log", port, args.epochs, args.preempt_at, scenario.signal, args.timeout, args.poll,
        scenario.processes,
    )
    first_wall = time.monotonic() - started
    expected = exits.STOPPED if scenario.signal == signal.SIGTERM else -scenario.signal
    if first["exit_code"] != expected:
        raise RuntimeError(f"{scenario.key}: the trainer exited {first['exit_code']} after "
                           f"{signal.Signals(scenario.signal).name}, not {expected}; "
                           f"log {out / 'first.log'}:\n{_tail(out / 'first.log')}")  # fmt: skip
    m = first["metrics"]
    last_step = int(m[STEP])
    step_seconds = seconds_per_step(m[TRAIN_SECONDS], last_step, m.get(RESUME_STEP, 0))
    print(f"  {scenario.key}: preempted at step {last_step} ({signal.Signals(scenario.signal).name}, exit "
          f"{first['exit_code']} after {first['exit_seconds']:.2f} s); resuming", flush=True)  # fmt: skip

    started = time.monotonic()
    resumed_log = out / "resumed.log"
    with open(resumed_log, "w") as log_file:
        proc = subprocess.run([*cmd, "--resume"], stdout=log_file, stderr=subprocess.STDOUT, env=_child_env(),
                              timeout=args.timeout)  # fmt: skip
    resumed_wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{scenario.key}: the resumed run exited {proc.returncode}; log {resumed_log}:\n"
                           f"{_tail(resumed_log)}")  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    resume_step = int(summary["resume_step"])
    parts = summary["time_seconds"]

    first_saves = parse_saves((out / "first.log").read_text(errors="replace"))
    saves = first_saves + parse_saves(resumed_log.read_text(errors="replace"))
    sigterm_save = None
    if scenario.signal == signal.SIGTERM:
        stopped = json.loads((out / "termination-log.json").read_text())
        stopped_at = stopped.get(summary_keys.GLOBAL_STEP)
        if stopped_at != resume_step:
            print(f"  warning: {scenario.key} stopped at step {stopped_at} but resumed at {resume_step}",
                  flush=True)  # fmt: skip
        name = stopped.get("checkpoint")
        matching = [s for s in first_saves if s.name == name]
        if matching:  # the save the signal asked for, apart from the ones by time
            sigterm_save = matching[-1].blocked
            saves = [s for s in saves if s is not matching[-1]]
    cost = preemption_cost(last_step, resume_step, step_seconds, first["exit_seconds"], parts["restore"])
    share = checkpoint_share(m.get("pets_checkpoint_seconds_total", 0.0) + parts["checkpoint"],
                             m[TRAIN_SECONDS] + parts["train"])  # fmt: skip
    if not args.keep_checkpoints:
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
    return {
        "key": scenario.key,
        "label": scenario.label,
        "processes": [scenario.processes, 1],
        "interval_seconds": interval,
        "signal": signal.Signals(scenario.signal).name,
        "exit_code": first["exit_code"],
        "steps_total": int(m[STEPS_TOTAL]),
        "target_step": first["target_step"],
        "last_read_step": last_step,
        "resume_step": resume_step,
        "seconds_per_step": step_seconds,
        **cost,
        "resumed_startup_seconds": parts["startup"],
        "step_saves": save_stats([s.blocked for s in saves if s.is_step]),
        "sigterm_save": sigterm_save,
        "epoch_saves": save_stats([s.blocked for s in saves if not s.is_step]),
        "checkpoint_share": share,
        "first_wall_seconds": first_wall,
        "resumed_wall_seconds": resumed_wall,
        "resumed_time_seconds": parts,
        "output_dir": str(out),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pets_training.bench_preempt", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--model", default="resnet18", help="timm model (default: resnet18)")
    parser.add_argument("--image-size", type=int, default=64, help="pixels (default: 64)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of the training (default: 3)")
    parser.add_argument("--batch-size", type=int, default=32, help="(default: 32)")
    parser.add_argument("--classes", type=int, default=16, help="synthetic classes (default: 16)")
    parser.add_argument("--images-per-class", type=int, default=400, help="synthetic images per class "
                        "(default: 400; 80 %% train: 160 steps per epoch at batch 32)")  # fmt: skip
    parser.add_argument("--interval", type=float, default=5.0,
                        help="--checkpoint-interval-seconds of the step-checkpoint scenarios (default: 5)")
    parser.add_argument("--preempt-at", type=float, default=1.7,
                        help="where to preempt, in epochs from the start (default: 1.7, 70 %% into epoch 2)")
    parser.add_argument("--trainer-args", default="",
                        help='more trainer flags, one string (--trainer-args="--threads 1")')
    parser.add_argument("--output", default="output", help="writes <output>/bench-preempt.json and the runs "
                        "under <output>/bench-preempt/ (default: output)")  # fmt: skip
    parser.add_argument("--keep-checkpoints", action="store_true", help="keep the runs' checkpoints")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per trainer run (default: 900)")
    parser.add_argument("--poll", type=float, default=0.05,
                        help="seconds between metrics reads (default: 0.05)")
    args = parser.parse_args(argv)
    if args.interval <= 0:
        parser.error(f"--interval must be positive, got {args.interval}")
    if not 0 < args.preempt_at < args.epochs:
        parser.error(f"--preempt-at must lie inside the run (0 < at < --epochs {args.epochs}), "
                     f"got {args.preempt_at}")

    common = ["--data", "synthetic", "--model", args.model, "--image-size", str(args.image_size),
              "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
              "--synthetic-classes", str(args.classes),
              "--synthetic-images-per-class", str(args.images_per_class),
              "--no-pretrained", *shlex.split(args.trainer_args)]  # fmt: skip
    output = Path(args.output)
    root = output / "bench-preempt"
    print(f"bench-preempt: {args.model}, {args.image_size} px, {args.epochs} epochs, {args.classes} x "
          f"{args.images_per_class} synthetic images, batch {args.batch_size}; "
          f"preempt at {args.preempt_at:g} epochs; step checkpoints every {args.interval:g} s; "
          f"runs under {root}", flush=True)  # fmt: skip
    started = time.monotonic()
    results = [run_scenario(s, args, common, root) for s in SCENARIOS]
    wall = time.monotonic() - started
    lines = table(results)
    (output / "bench-preempt.json").write_text(json.dumps({
        "model": args.model, "image_size": args.image_size, "epochs": args.epochs,
        "batch_size": args.batch_size, "classes": args.classes, "images_per_class": args.images_per_class,
        "interval_seconds": args.interval, "preempt_at_epochs": args.preempt_at,
        "trainer_args": args.trainer_args, "wall_seconds": round(wall, 1),
        "scenarios": results, "lost_seconds": {r["key"]: round(r["lost_seconds"], 3) for r in results},
    }, indent=1))  # fmt: skip
    print("\n".join(lines), flush=True)
    print(f"(lost steps are a lower bound: the last pets_step read before the signal; {wall:.0f} s in all; "
          f"{output / 'bench-preempt.json'})", flush=True)  # fmt: skip
    print(final_line(results), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
