"""Rank 0's Prometheus gauges (docs/contract.md, "Progress"): one table, read by the trainer that serves
them, the operator that parses, checks and mirrors them, and the docs.

Each gauge has one name on each side: the trainer's key (a progress.jsonl key, or the key it sets live),
the Prometheus name (``pets_`` + key), and the status field it feeds. A scraped value outside 0..top
is refused; 2**53 keeps an integer exact as a JSON number, an accuracy is a fraction.
"""

from __future__ import annotations

from dataclasses import dataclass

TOP = 2**53

# Where a gauge's value goes in the status.
PROGRESS = "progress"  # a field of the status itself (status.<field>)
TIME = "time"  # a run's time split: status.goodput.attempts[].<field>, and the summary's time_seconds
DATASET = "dataset"  # the trainer's dataset report: status.dataset.<field>, and the summary's dataset
TRACKING = "tracking"  # how the run's trackers fare (MLflow): status.tracking.ok and TrackingDegraded


@dataclass(frozen=True)
class Gauge:
    key: str  # the trainer's name: its progress.jsonl key, and the gauge's name without `pets_`
    help: str
    group: str  # PROGRESS, TIME or DATASET
    field: str | None  # the status field it feeds; None: served, not read
    kind: type = float  # int: a count, refused when not integral
    top: float = TOP
    summary_key: str | None = None  # its key in the summary's time_seconds or dataset
    within: str | None = None  # a time gauge that is a share of this part (counted there too), not a part

    @property
    def name(self) -> str:
        return f"pets_{self.key}"


def _progress(key: str, field: str, kind: type, help: str, top: float = TOP) -> Gauge:
    return Gauge(key, help, PROGRESS, field, kind, top)


def _time(key: str, field: str | None, part: str | None, help: str, within: str | None = None) -> Gauge:
    return Gauge(key, help, TIME, field, float, TOP, part, within)


def _dataset(key: str, field: str, help: str) -> Gauge:
    return Gauge(f"dataset_{key}", help, DATASET, field, int, TOP, key)


GAUGES = (
    _progress("epoch", "epoch", int, "last finished epoch"),
    _progress("total_epochs", "totalEpochs", int, "epochs in the whole run"),
    _progress("train_loss", "trainLoss", float, "mean training loss of the last epoch"),
    _progress("eval_accuracy", "evalAccuracy", float, "evaluation accuracy after the last epoch (0-1)", 1),
    _progress("images_per_second", "imagesPerSecond", float, "training images per second, all processes"),
    _progress("elapsed_seconds", "elapsedSeconds", float, "seconds of training so far"),
    _progress("eta_seconds", "etaSeconds", float, "estimated seconds to the end"),
    _progress("step", "step", int, "optimizer steps taken so far in the whole run (resumed runs included)"),
    _progress("steps_total", "stepsTotal", int,
              "optimizer steps of the whole run (steps per epoch x epochs)"),
    # lastCheckpoint: {epoch, step, time}; a step checkpoint mid-epoch moves its step without the epoch
    _progress("checkpoint_epoch", "lastCheckpoint.epoch", int,
              "epoch of the newest complete checkpoint (0: none yet)"),
    _progress("checkpoint_step", "lastCheckpoint.step", int,
              "global step of the newest complete checkpoint, epoch or step (0: none yet)"),
    _progress("resume_step", "resumeStep", int, "global step this run resumed at (0: a fresh start)"),
    _progress("resume_skipped_checkpoints", "resumeSkippedCheckpoints", int,
              "newer step checkpoints this run could not resume from "
              "(another world size or steps per epoch)"),
    # Where this process's run spends its wall time (docs/trainer.md, "Where a run's time goes").
    _time("startup_seconds", "startupSeconds", "startup",
          "seconds from the start of this run to the end of its first training step, less the restore"),
    _time("train_seconds_total", "trainSeconds", "train",
          "seconds of this run in the epoch loop after its first training step, "
          "less eval and checkpoint saves"),
    _time("train_input_wait_seconds_total", "inputWaitSeconds", "train_input_wait",
          "seconds of this run's train time the training loop waited for its next batch (the loader, and "
          "making the batch ready in this process): the input pipeline holding the step back",
          within="train"),
    _time("eval_seconds_total", "evalSeconds", "eval", "seconds of this run in evaluation"),
    _time("checkpoint_seconds_total", "checkpointSeconds", "checkpoint",
          "seconds the training loop was blocked saving checkpoints in this process's run (epoch and step)"),
    _time("restore_seconds", "restoreSeconds", "restore",
          "seconds this run's resume took: finding and loading the checkpoint (0: no --resume)"),
    _time("checkpoint_last_seconds", None, None, "seconds the newest checkpoint's save took"),
    # What the trainer made of the data (its dataset.json), served once set up.
    _dataset("images", "images", "images the trainer found and could read"),
    _dataset("classes", "classes", "classes among them"),
    _dataset("skipped", "skipped", "files left out: not images, unlabelled or unreadable"),
    _dataset("train_images", "trainImages", "images in the training split"),
    _dataset("eval_images", "evalImages", "images in the evaluation split"),
    Gauge("tracking_failures", "tracking servers this run could not write to (MLflow down, slow or "
          "refusing; training goes on without them): 0 when every tracker is well", TRACKING, "tracking",
          int),
)

BY_KEY = {gauge.key: gauge for gauge in GAUGES}
# What the operator reads from a scrape: every gauge that feeds a status field, by Prometheus name.
READ = {gauge.name: gauge for gauge in GAUGES if gauge.field is not None}


def group(name: str) -> tuple[Gauge, ...]:
    return tuple(gauge for gauge in GAUGES if gauge.group == name)


# The parts of a run's wall time, in the summary's time_seconds (pets_training.progress.TimeSplit): they do
# not overlap, so they add up. TIME_SHARES, in time_seconds too, are each a share of one of them.
TIME_PARTS = tuple(gauge.summary_key for gauge in group(TIME) if gauge.summary_key and not gauge.within)
TIME_SHARES = tuple(gauge.summary_key for gauge in group(TIME) if gauge.summary_key and gauge.within)
# The dataset report's counts, in dataset.json and the summary's dataset.
DATASET_COUNTS = tuple(gauge.summary_key for gauge in group(DATASET) if gauge.summary_key)
