"""Loss and accuracy curves from a training's progress.jsonl, as a PNG (matplotlib, when installed)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .errors import PetsClientError


class PlotUnavailableError(PetsClientError):
    """matplotlib is not installed."""


def read_progress(text: str) -> list[dict[str, Any]]:
    """The epoch records of a progress.jsonl, in epoch order; blank and broken lines are skipped (a
    training killed mid-write leaves half a line), and a resumed run's repeated epochs keep the last.
    The file came from the training's volume: a line nested too deep to parse is skipped as broken."""
    by_epoch: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        epoch = record.get("epoch") if isinstance(record, dict) else None
        if isinstance(epoch, int) and not isinstance(epoch, bool) and abs(epoch) < 2**53:
            by_epoch[epoch] = record
    return [by_epoch[e] for e in sorted(by_epoch)]


def _number(value: Any) -> float | None:
    """A finite int or float (not a bool) as a float, else None: the curves plot nothing else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


MAX_EPOCH_TICKS = 50  # more epochs than this: matplotlib picks the ticks


def plot_progress(records: list[dict[str, Any]], out: Path | str, title: str | None = None) -> Path:
    """Write training loss and eval accuracy (%) per epoch side by side to ``out`` (PNG)."""
    if not records:
        raise PetsClientError("progress.jsonl has no epoch records yet: nothing to plot")
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotUnavailableError(
            "plotting needs matplotlib, which is not installed: pip install matplotlib "
            "(or use the training's own metrics.png: kubectl pets fetch NAME DIR)") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [r["epoch"] for r in records]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(9, 3.5))
    # Only numbers are plotted: a value of another type (a string, a list...) is left out.
    loss = [(r["epoch"], v) for r in records if (v := _number(r.get("train_loss"))) is not None]
    acc = [(r["epoch"], 100 * v) for r in records if (v := _number(r.get("eval_accuracy"))) is not None]
    if loss:
        ax_loss.plot(*zip(*loss, strict=True), marker="o")
    if acc:
        ax_acc.plot(*zip(*acc, strict=True), marker="o", color="tab:green")
    ax_loss.set(title="training loss", xlabel="epoch")
    ax_acc.set(title="eval accuracy (%)", xlabel="epoch")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        if len(epochs) <= MAX_EPOCH_TICKS:
            ax.set_xticks(epochs)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)
    return path
