"""Rank 0's progress and final summary mirrored into the status: which gauge becomes which field, within
which range, and what a finished run's summary overrides. The progress parser reads READ_FIELDS from
here (the gauges it keeps)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pets_operator import goodput
from pets_operator.backends import timestamp
from pets_operator.plan_types import Event, Plan

# metric -> (status field, type, top): a scraped value outside 0..top is refused (progress.check_progress);
# 2**53 keeps an integer exact as a JSON number, an accuracy is a fraction.
PROGRESS_TOP = 2**53


PROGRESS_FIELDS = {
    "pets_epoch": ("epoch", int, PROGRESS_TOP),
    "pets_total_epochs": ("totalEpochs", int, PROGRESS_TOP),
    "pets_train_loss": ("trainLoss", float, PROGRESS_TOP),
    "pets_eval_accuracy": ("evalAccuracy", float, 1),
    "pets_images_per_second": ("imagesPerSecond", float, PROGRESS_TOP),
    "pets_elapsed_seconds": ("elapsedSeconds", float, PROGRESS_TOP),
    "pets_eta_seconds": ("etaSeconds", float, PROGRESS_TOP),
    "pets_step": ("step", int, PROGRESS_TOP),
    "pets_steps_total": ("stepsTotal", int, PROGRESS_TOP),
    "pets_checkpoint_epoch": ("lastCheckpoint", int, PROGRESS_TOP),  # becomes lastCheckpoint: {epoch, time}
    "pets_checkpoint_step": ("lastCheckpoint.step", int, PROGRESS_TOP),  # and its step (after the epoch)
    "pets_resume_step": ("resumeStep", int, PROGRESS_TOP),  # where this attempt began (work_lost)
    # step checkpoints it could not resume from (checkpoints_skipped)
    "pets_resume_skipped_checkpoints": ("resumeSkippedCheckpoints", int, PROGRESS_TOP),
}


# What the trainer made of the data (its dataset report, dataset.json): gauge -> status.dataset field,
# and the summary's "dataset" key of each
DATASET_FIELDS = {
    "pets_dataset_images": ("images", int, PROGRESS_TOP),
    "pets_dataset_classes": ("classes", int, PROGRESS_TOP),
    "pets_dataset_skipped": ("skipped", int, PROGRESS_TOP),
    "pets_dataset_train_images": ("trainImages", int, PROGRESS_TOP),
    "pets_dataset_eval_images": ("evalImages", int, PROGRESS_TOP),
}


SUMMARY_DATASET_KEYS = {"images": "images", "classes": "classes", "skipped": "skipped",
                        "train_images": "trainImages", "eval_images": "evalImages"}


DATASET_LAYOUTS = ("synthetic", "flat", "oxford", "imagefolder")


# What a progress read keeps (operator/pets_operator/progress.py): the mirrored fields, the dataset
# report's counts, and the run's time split for status.goodput.
READ_FIELDS = {**PROGRESS_FIELDS, **DATASET_FIELDS, **goodput.GAUGE_FIELDS}


def mirror_dataset(status: dict[str, Any], counts: dict[str, int], layout: Any = None) -> None:
    """status.dataset: the counts of the trainer's dataset report (and its layout, from the summary)."""
    dataset = {**(status.get("dataset") or {}), **counts}
    if layout in DATASET_LAYOUTS:
        dataset["layout"] = layout
    if dataset:
        status["dataset"] = dataset


def mirror_progress(status: dict[str, Any], progress: dict[str, float], now: datetime) -> None:
    changed = False
    for metric, (key, kind, _top) in PROGRESS_FIELDS.items():
        if metric not in progress:
            continue
        value = kind(round(progress[metric], 6))
        if key == "lastCheckpoint":
            if value and (status.get(key) or {}).get("epoch") != value:
                status[key] = {"epoch": value, "time": timestamp(now)}
            continue
        if key == "lastCheckpoint.step":  # a step checkpoint mid-epoch moves it without the epoch
            newest = status.get("lastCheckpoint") or {}
            if value and newest.get("step") != value:
                status["lastCheckpoint"] = {**newest, "step": value, "time": timestamp(now)}
            continue
        changed |= status.get(key) != value
        status[key] = value
    if "epoch" in status and "totalEpochs" in status:
        status["progress"] = f"{status['epoch']}/{status['totalEpochs']}"
    mirror_dataset(status, {key: int(progress[metric])
                             for metric, (key, _kind, _top) in DATASET_FIELDS.items() if metric in progress})
    if changed:  # an unchanged scrape writes nothing, so an idle poll costs no API write
        status["lastProgressTime"] = timestamp(now)


def work_lost(result: Plan, resume_step: Any) -> None:
    """Once the attempt after a restart says where it resumed (its progress, or its final summary): the
    steps the last one had done past that point, done again. At least: the last attempt's step is as
    last read (every progress interval), so it may have gone further."""
    failure = result.status.get("lastFailure") or {}
    known = isinstance(resume_step, int | float) and not isinstance(resume_step, bool) and \
        0 <= resume_step <= PROGRESS_TOP
    if "lastStep" not in failure or "lostSteps" in failure or not known:
        return
    lost = max(0, int(failure["lastStep"]) - int(resume_step))
    failure["lostSteps"] = lost
    result.events.append(Event("Normal" if lost == 0 else "Warning", "WorkLost", (
        f"attempt {max(0, int(result.status.get('attempt') or 1) - 1)} lost at least {lost} step(s): last "
        f"read at step {failure['lastStep']}, the next attempt resumed at step "
        f"{int(resume_step)}")))


def checkpoints_skipped(result: Plan, old: dict[str, Any]) -> None:
    """A run that could not resume from the newest step checkpoint(s) says so once: they count steps of
    another world size or steps per epoch (an edit while suspended), so it resumed further back."""
    skipped = result.status.get("resumeSkippedCheckpoints")
    if not skipped or skipped == old.get("resumeSkippedCheckpoints"):
        return
    result.events.append(Event("Warning", "CheckpointSkipped", (
        f"this run could not resume from the {skipped} newest step checkpoint(s): they were made with "
        "another world size or steps per epoch (rank 0's log names them and the values), so it resumed "
        f"further back, at step {result.status.get('resumeStep', 0)} (0: from the start)")))


def is_count(value: Any) -> bool:
    """An integer (not a bool) in 0..PROGRESS_TOP: a count from the summary a status can hold."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= PROGRESS_TOP


def mirror_summary(status: dict[str, Any], summary: dict[str, Any], total_epochs: int) -> None:
    status["summary"] = summary  # pods.parse_summary let only numbers a status can hold through

    def number(key: str, top: float) -> float | None:
        value = summary.get(key)
        ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= top
        return float(value) if ok else None  # type: ignore[arg-type]

    # The last progress read may be an epoch old: the run's own final figures win.
    for key, field_name, top in (("final_accuracy", "evalAccuracy", 1.0), ("final_train_loss", "trainLoss",
                                 PROGRESS_TOP), ("images_per_second", "imagesPerSecond", PROGRESS_TOP),
                                 ("elapsed_seconds", "elapsedSeconds", PROGRESS_TOP)):
        if (value := number(key, top)) is not None:
            status[field_name] = value
    if summary.get("status") == "succeeded" and is_count(status.get("stepsTotal")):
        status["step"] = status["stepsTotal"]  # every step of the run was taken
    if (skipped := number("resume_skipped_checkpoints", PROGRESS_TOP)) is not None:
        status["resumeSkippedCheckpoints"] = int(skipped)
    report = summary.get("dataset")
    if isinstance(report, dict):
        counts = {key: report[name] for name, key in SUMMARY_DATASET_KEYS.items()
                  if is_count(report.get(name))}
        mirror_dataset(status, counts, report.get("layout"))
    if is_count(summary.get("epochs")):
        status["epoch"] = summary["epochs"]
        status["totalEpochs"] = total_epochs
        status["progress"] = f"{summary['epochs']}/{total_epochs}"
    status["etaSeconds"] = 0.0
