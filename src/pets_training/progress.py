"""Progress a person and a program can read (docs/contract.md): a bar or periodic lines, progress.jsonl,
Prometheus gauges from rank 0, the summary JSON, and the metrics plot."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pets_contract import gauges
from pets_contract.gauges import TIME_PARTS, TIME_SHARES
from pets_contract.names import PLOT_FILE, PROGRESS_FILE, SUMMARY_FILE
from pets_contract.samples import SAMPLES_DISTINCT, SAMPLES_TRAINED
from pets_contract.summary import LIMIT as SUMMARY_LIMIT

log = logging.getLogger(__name__)

__all__ = ["PLOT_FILE", "PROGRESS_FILE", "SUMMARY_FILE", "SUMMARY_LIMIT", "TIME_PARTS", "TIME_SHARES"]


class TimeSplit:
    """Where this process's run spends its wall time, in parts that do not overlap, so they add up
    (docs/trainer.md, "Where a run's time goes"). From ``start`` (the start of this run) the time is
    charged piece by piece, each piece to the part it was spent in: ``restore``, ``eval`` and
    ``checkpoint`` where the trainer says so, the rest to ``startup`` until the first training step of this
    run ends (:meth:`first_step_done`), to ``train`` after it. Within ``train``, ``input_wait`` counts
    the loop's waits for its next batch. ``startup_parts`` splits the time up to that first step by what
    the trainer did (:meth:`startup_done`: imports, data, model...; make bench-startup)."""

    def __init__(self, start: float | None = None) -> None:
        self.seconds = dict.fromkeys(TIME_PARTS, 0.0)
        self.input_wait = 0.0  # a share of train (TIME_SHARES' train_input_wait), not a part of its own
        self.mark = time.perf_counter() if start is None else start
        self.stepped = False  # the first training step of this run is done
        self.startup_parts: dict[str, float] = {}  # in the order they came; they add up to the first step
        self._startup_mark = self.mark

    def startup_done(self, part: str, now: float | None = None) -> None:
        """The start-up's ``part`` ends now (nothing once the first step is done)."""
        if self.stepped:
            return
        now = time.perf_counter() if now is None else now
        self.startup_parts[part] = round(self.startup_parts.get(part, 0.0) + now - self._startup_mark, 3)
        self._startup_mark = now

    def charge(self, part: str | None = None, now: float | None = None) -> float:
        """Add the time since the last charge to ``part`` (None: ``startup`` before the first training step
        ended, else ``train``); returns now, where the next piece starts."""
        now = time.perf_counter() if now is None else now
        part = part or ("train" if self.stepped else "startup")
        self.seconds[part] += now - self.mark
        self.mark = now
        return now

    def first_step_done(self, now: float | None = None) -> None:
        """The first training step of this run has ended: what came before it is startup."""
        now = time.perf_counter() if now is None else now
        self.startup_done("first step", now)
        self.charge("startup", now)
        self.stepped = True

    def waited_for_input(self, since: float, now: float | None = None) -> None:
        """The training loop waited for its next batch from ``since`` until now: a share of train once the
        first step is done (before, the first batch's wait is start-up's, the loader's start)."""
        if self.stepped:
            self.input_wait += (time.perf_counter() if now is None else now) - since

    def rounded(self) -> dict[str, float]:
        """The summary's ``time_seconds``: every part, then the share of train that waited for input, in
        seconds, to the millisecond."""
        (share,) = TIME_SHARES
        return {**{part: round(seconds, 3) for part, seconds in self.seconds.items()},
                share: round(self.input_wait, 3)}


def epoch_record(
    epoch: int,
    total_epochs: int,
    train_loss: float,
    eval_accuracy: float,
    images_per_second: float,
    elapsed_seconds: float,
    epoch_seconds: Sequence[float],
    coverage: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """One progress.jsonl line. ETA = mean epoch time so far x epochs left. ``coverage``: the epoch's
    (samples trained, distinct samples), pets_contract.samples."""
    mean_epoch = sum(epoch_seconds) / len(epoch_seconds) if epoch_seconds else 0.0
    counts = {} if coverage is None else {SAMPLES_TRAINED: coverage[0], SAMPLES_DISTINCT: coverage[1]}
    return {
        "epoch": epoch,
        "total_epochs": total_epochs,
        "train_loss": round(train_loss, 6),
        "eval_accuracy": round(eval_accuracy, 6),
        "images_per_second": round(images_per_second, 2),
        "elapsed_seconds": round(elapsed_seconds, 2),
        "eta_seconds": round(mean_epoch * (total_epochs - epoch), 2),
        **counts,
    }


class MetricsServer:
    """Prometheus gauges of the latest epoch, the step and the newest checkpoint, served over HTTP (rank 0
    only). ``values`` holds what was set, by progress.jsonl key. A gauge is served from its first value
    on: before the first epoch ends there is no loss or accuracy, and a 0 would read as a measurement."""

    def __init__(self, port: int):
        from prometheus_client import CollectorRegistry, start_http_server

        self.registry = CollectorRegistry()
        self.gauges: dict[str, Any] = {}
        self.values: dict[str, float] = {}
        self.server, self.thread = start_http_server(port, registry=self.registry)
        log.info("serving Prometheus metrics on port %d (/metrics)", port)

    def update(self, record: dict[str, Any]) -> None:
        for gauge in gauges.group(gauges.PROGRESS):
            if gauge.key in record:
                self.set(gauge.key, record[gauge.key])

    def set(self, key: str, value: float) -> None:
        """One gauge by its progress.jsonl key; cheap enough for every step (a locked float write)."""
        if key not in self.gauges:
            from prometheus_client import Gauge

            gauge = gauges.BY_KEY[key]
            self.gauges[key] = Gauge(gauge.name, gauge.help, registry=self.registry)
        self.values[key] = float(value)
        self.gauges[key].set(float(value))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def append_progress(output_dir: Path, record: dict[str, Any]) -> None:
    with (output_dir / PROGRESS_FILE).open("a") as f:
        f.write(json.dumps(record) + "\n")


def summary_json(summary: dict[str, Any]) -> str:
    """The summary as one JSON document under 4 KiB (a long error is cut to fit)."""
    text = json.dumps(summary)
    if len(text.encode()) > SUMMARY_LIMIT and "error" in summary:
        over = len(text.encode()) - SUMMARY_LIMIT + 20
        cut = dict(
            summary, error=str(summary["error"])[: max(0, len(str(summary["error"])) - over)] + " [cut]"
        )
        text = json.dumps(cut)
    return text


def write_summary(summary: dict[str, Any], paths: Sequence[Path | str | None]) -> None:
    text = summary_json(summary)
    for path in paths:
        if path is None:
            continue
        try:
            Path(path).write_text(text + "\n")
        except OSError as err:
            log.warning("could not write the summary to %s: %s", path, err)


def plot_metrics(history: Sequence[dict[str, Any]], path: Path) -> None:
    """Loss and accuracy per epoch, side by side, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [r["epoch"] for r in history]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax_loss.plot(epochs, [r["train_loss"] for r in history], marker="o")
    ax_loss.set(title="training loss", xlabel="epoch")
    ax_acc.plot(epochs, [100 * r["eval_accuracy"] for r in history], marker="o", color="tab:green")
    ax_acc.set(title="eval accuracy (%)", xlabel="epoch")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.set_xticks(epochs)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


class StepProgress:
    """A tqdm bar when stderr is a terminal, else a log line every ``every`` seconds (and at the end)."""

    def __init__(
        self, total: int, epoch: int, epochs: int, enabled: bool, every: float, tty: bool | None = None
    ):
        self.total = total
        self.label = f"epoch {epoch}/{epochs}"
        self.enabled = enabled
        self.every = every
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.bar: Any = None
        self.start = self.last = time.monotonic()
        self.step = 0
        self.images = 0
        if enabled and self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=self.label, unit="step", leave=False)

    def update(self, loss: Any, images: int) -> None:
        """``loss`` may be a tensor: it is only read (a device sync) when shown, every ``every`` seconds
        (the bar moves every step, its loss with the log's)."""
        self.step += 1
        self.images += images
        if not self.enabled:
            return
        now = time.monotonic()
        rate = self.images / max(now - self.start, 1e-9)
        if self.bar is not None:
            if now - self.last >= self.every:
                self.last = now
                self.bar.set_postfix(loss=f"{float(loss):.3f}", img_s=f"{rate:.1f}")
            self.bar.update(1)
        elif now - self.last >= self.every:
            self.last = now
            log.info(
                "%s step %d/%d loss %.4f %.1f images/s", self.label, self.step, self.total, float(loss), rate
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
