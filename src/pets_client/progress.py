"""What `wait` shows while a training runs: pure functions from a PetsTraining's status to a bar's
state and to the lines it prints. No Kubernetes, no tqdm here, so they are unit-tested as they are; the
status fields are the contract's (pets_contract, standard library only)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    from pets_contract import gauges, goodput, summary
except ModuleNotFoundError:  # run as a file by the host's python3 (make demo): the contract is beside it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pets_contract import gauges, goodput, summary


def _field(key: str) -> str:
    """The status field rank 0's gauge `key` feeds."""
    return str(gauges.BY_KEY[key].field)


EPOCH, TOTAL_EPOCHS, STEP, STEPS_TOTAL, ETA = map(_field, ("epoch", "total_epochs", "step", "steps_total",
                                                  "eta_seconds"))
TRAIN_LOSS, EVAL_ACCURACY, IMAGES_PER_SECOND = map(_field, ("train_loss", "eval_accuracy",
                                                            "images_per_second"))
# status.dataset's counts
IMAGES, CLASSES, SKIPPED, TRAIN_IMAGES, EVAL_IMAGES = (_field(f"dataset_{key}") for key in (
    "images", "classes", "skipped", "train_images", "eval_images"))


@dataclass(frozen=True)
class BarState:
    """Where the progress bar stands: ``n`` of ``total`` ``unit``s, with the latest metrics and the epoch
    in its description."""

    n: int
    total: int | None
    unit: str
    postfix: dict[str, str] = field(default_factory=dict)
    desc: str = ""


def _int(value: Any) -> int | None:
    try:
        return None if value is None or isinstance(value, bool) else int(value)
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float | None:
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


def postfix(status: dict[str, Any]) -> dict[str, str]:
    """loss, acc and img/s from status, formatted; absent values are left out."""
    shown = (("loss", TRAIN_LOSS, "{:.4f}", 1), ("acc", EVAL_ACCURACY, "{:.1f}%", 100),
             ("img/s", IMAGES_PER_SECOND, "{:.1f}", 1))  # (key, status field, format, scale)
    return {key: fmt.format(scale * value) for key, field, fmt, scale in shown
            if (value := _float(status.get(field))) is not None}


def bar_state(status: dict[str, Any]) -> BarState:
    """One bar, one unit: optimizer steps over the whole run (``step``/``stepsTotal``), the epoch in its
    description, and 100 % once the training has Succeeded (the last scrape may predate the last step).
    No total until the operator has reported ``stepsTotal``: a bar of epochs first and steps later would
    switch units and restart its total."""
    epochs = _int(status.get(TOTAL_EPOCHS))
    epoch = max(_int(status.get(EPOCH)) or 0, 0)
    succeeded = status.get("phase") == "Succeeded"
    desc = ""
    if epochs and epochs > 0:
        desc = f"epoch {epochs if succeeded else min(epoch + 1, epochs)}/{epochs}"
    steps_total = _int(status.get(STEPS_TOTAL))
    if not steps_total or steps_total < 0:
        return BarState(0, None, "step", postfix(status), desc)
    n = steps_total if succeeded else min(max(_int(status.get(STEP)) or 0, 0), steps_total)
    return BarState(n, steps_total, "step", postfix(status), desc)


def phase_line(name: str, old: dict[str, Any] | None, new: dict[str, Any]) -> str | None:
    """A line to print when the phase or the message changed (a Pending reason, a restart...), else None."""
    old = old or {}
    phase, message = new.get("phase"), new.get("message")
    if phase == old.get("phase") and message == old.get("message"):
        return None
    if not phase and not message:
        return None
    text = f"{name}: {phase or 'no status yet'}"
    return f"{text}: {message}" if message else text


def dataset_line(name: str, old: dict[str, Any] | None, new: dict[str, Any]) -> str | None:
    """One line when status.dataset first says what the trainer made of the data (or it changes)."""
    dataset: dict[str, Any] = new["dataset"] if isinstance(new.get("dataset"), dict) else {}
    before = (old or {}).get("dataset")
    before = before if isinstance(before, dict) else {}
    images, classes = _int(dataset.get(IMAGES)), _int(dataset.get(CLASSES))
    if images is None or classes is None or dataset.get(IMAGES) == before.get(IMAGES):
        return None
    skipped = _int(dataset.get(SKIPPED)) or 0
    text = f"{name}: dataset: {images} images in {classes} classes"
    if skipped:
        files = "file" if skipped == 1 else "files"
        text += f", {skipped} {files} skipped (dataset.json in the output names them)"
    train, evals = _int(dataset.get(TRAIN_IMAGES)), _int(dataset.get(EVAL_IMAGES))
    if train is not None and evals is not None:
        text += f"; {train} for training, {evals} for evaluation"
    return text


def _goodput(status: dict[str, Any]) -> tuple[dict[str, Any], float | None, float | None]:
    """status.goodput (empty when absent or not an object), its ratio and its wall seconds."""
    book = status.get("goodput")
    book = book if isinstance(book, dict) else {}
    return book, _float(book.get(goodput.RATIO)), _float(book.get(goodput.WALL))


def final_line(name: str, status: dict[str, Any]) -> str:
    """One line for the end: the phase, the accuracy and the epochs, or why it failed."""
    phase = status.get("phase") or "unknown"
    parts = [f"{name}: {phase}"]
    acc = final_accuracy(status)
    if acc is not None:
        parts.append(f"final accuracy {acc:.4f} ({100 * acc:.1f}%)")
    epoch, total = _int(status.get(EPOCH)), _int(status.get(TOTAL_EPOCHS))
    if epoch is not None and total:
        parts.append(f"epoch {epoch}/{total}")
    book, ratio, wall = _goodput(status)
    if ratio is not None and wall:
        kept = f"goodput {100 * ratio:.0f}% of {wall:.0f} s"
        lost = _float(book.get(goodput.LOST))
        parts.append(kept + (f" ({lost:.0f} s of work lost to restarts)" if lost else ""))
    if phase != "Succeeded" and status.get("message"):
        parts.append(str(status["message"]))
    return ", ".join(parts)


# status.goodput's parts, in the order a reader asks about them (docs/operator.md, "Preemption and goodput").
TIME_PARTS = ((goodput.PRODUCTIVE, "training"), (goodput.STARTUP, "start-up"), (goodput.EVAL, "evaluation"),
              (goodput.CHECKPOINT, "checkpoints"), (goodput.RESTORE, "restores"), (goodput.LOST, "work lost"),
              (goodput.RESIZING, "resizing"), (goodput.WAITING, "waiting"),
              (goodput.UNACCOUNTED, "unaccounted"))


def time_split_line(status: dict[str, Any]) -> str | None:
    """Where a training's wall time went, from status.goodput: the ratio, then each part that took any
    time. None before the operator has booked any."""
    book, ratio, wall = _goodput(status)
    if ratio is None or not wall:
        return None
    wait = _float(book.get(goodput.INPUT_WAIT))  # a share of the training time: said beside it
    parts = []
    for key, label in TIME_PARTS:
        if (seconds := _float(book.get(key))) is None or round(seconds, 1) <= 0:
            continue
        waited = key == goodput.PRODUCTIVE and wait is not None and round(wait, 1) > 0
        parts.append(f"{label} {seconds:.1f} s" + (f" (waiting for input {wait:.1f} s)" if waited else ""))
    return f"goodput {ratio:.2f} of {wall:.0f} s: " + ", ".join(parts)


def final_accuracy(status: dict[str, Any]) -> float | None:
    said = status.get("summary") if isinstance(status.get("summary"), dict) else {}
    final = _float(said.get(summary.FINAL_ACCURACY)) if said else None
    return final if final is not None else _float(status.get(EVAL_ACCURACY))


def live_line(status: dict[str, Any]) -> str | None:
    """One line of what a training is doing now, for a terminal that polls it (`make demo`): the phase,
    then the pods and the step while it runs, and the last epoch's metrics once one has ended. Only
    measured figures: no loss, accuracy or ETA before the first epoch ends, no step before the first.
    None before the operator has written a status."""
    phase = status.get("phase")
    if not phase:
        return None
    parts: list[str] = []
    epoch, total_epochs = _int(status.get(EPOCH)), _int(status.get(TOTAL_EPOCHS))
    if phase == "Running":
        up = max(_int(status.get("readyReplicas")) or 0, _int(status.get("activeReplicas")) or 0)
        parts.append(f"{up}/{_int(status.get('replicas')) or '?'} pods")
        step, steps_total = _int(status.get(STEP)), _int(status.get(STEPS_TOTAL))
        parts.append(f"step {step}/{steps_total or '?'}" if step else "waiting for the first step")
    if epoch and phase in ("Running", "Succeeded"):
        parts.append(f"epoch {epoch}/{total_epochs or '?'}")
        parts += [f"{key} {value}" for key, value in postfix(status).items()]
        eta = _float(status.get(ETA))
        if phase == "Running" and eta is not None:
            parts.append(f"eta {eta:.0f}s")
    if _int(status.get("restarts")):
        parts.append(f"restarts {status['restarts']}")
    if phase not in ("Running", "Succeeded") and status.get("message"):
        parts.append(str(status["message"]))
    return f"{phase}: {', '.join(parts)}" if parts else f"{phase}:"


if __name__ == "__main__":
    # `python3 src/pets_client/progress.py < training.json`: runs on the host's Python alone (the file and
    # the contract import nothing outside the standard library), which is how `make demo` uses it before
    # any venv.
    # `--time-split`: where its time went (status.goodput) instead of what it is doing.
    read = time_split_line if sys.argv[1:] == ["--time-split"] else live_line
    line = read(json.load(sys.stdin).get("status") or {})
    if line:
        print(line)
