"""Rank 0's progress and final summary mirrored into the status, with what they say once (checkpoints a
run could not resume from, the work a restart lost). Which gauge becomes which field, within which range,
and what a finished run's summary overrides, are the contract's tables (pets_contract)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pets_contract import gauges
from pets_contract import summary as summary_keys
from pets_operator import goodput
from pets_operator.plan_types import Event, Plan, Round
from pets_operator.progress import in_range, is_count
from pets_operator.spec import snake
from pets_operator.status_types import Status
from pets_operator.timestamps import parse_timestamp, timestamp

PROGRESS_GAUGES = gauges.group(gauges.PROGRESS)  # each feeds status.<field>
DATASET_GAUGES = gauges.group(gauges.DATASET)  # each feeds status.dataset.<field>
DATASET_LAYOUTS = ("synthetic", "flat", "oxford", "imagefolder")


def progress(r: Round, plan: Plan) -> None:
    """Rank 0's gauges as last read into the status and its run's goodput entry, unless the status shows
    newer progress already (another replica's); a run listed before its first read gets its entry."""
    observed, status = r.observed, plan.status
    if observed.progress and not _older_than_status(observed.progress_read_at, r.old):
        _mirror_progress(status, observed.progress, r.now)
        goodput.read_attempt(status, r.target.attempt, observed.rank0_running_since, observed.progress)
        _checkpoints_skipped(plan, r.old)
        _work_lost(plan, observed.progress.get(gauges.BY_KEY["resume_step"].name))
    elif observed.rank0_running_since:  # listed before its first read: a resize may stop it before then
        goodput.read_attempt(status, r.target.attempt, observed.rank0_running_since, {})


def summary(r: Round, plan: Plan) -> None:
    """A run that finished before a progress read says it all in its summary: its figures win."""
    if not (said := r.observed.summary):
        return
    _mirror_summary(plan.status, said, r.spec.epochs)
    goodput.read_summary(plan.status, r.target.attempt, r.observed.rank0_running_since, said)
    _work_lost(plan, said.get("resume_step"))
    _checkpoints_skipped(plan, r.old)


def _mirror_dataset(status: Status, counts: dict[str, int], layout: Any = None) -> None:
    """status.dataset: the counts of the trainer's dataset report (and its layout, from the summary)."""
    dataset = {**(status.dataset or {}), **counts}
    if layout in DATASET_LAYOUTS:
        dataset["layout"] = layout
    if dataset:
        status.dataset = dataset


def _older_than_status(read_at: datetime | None, status: Status) -> bool:
    """Whether a reading was taken before the progress the status already shows: another replica, acting
    until it was lost, may have written a newer one, and writing ours would take status.step back (make
    chaos saw 22 go back to 16 right after the acting replica's pod was deleted)."""
    shown = status.last_progress_time
    return read_at is not None and bool(shown) and read_at < parse_timestamp(str(shown))


def _mirror_progress(status: Status, progress: dict[str, float], now: datetime) -> None:
    changed = False
    for gauge in PROGRESS_GAUGES:
        if gauge.name not in progress:
            continue
        key, value = str(gauge.field), gauge.kind(round(progress[gauge.name], 6))
        if key == "lastCheckpoint.epoch":
            if value and (status.last_checkpoint or {}).get("epoch") != value:
                status.last_checkpoint = {"epoch": value, "time": timestamp(now)}
            continue
        if key == "lastCheckpoint.step":  # a step checkpoint mid-epoch moves it without the epoch
            newest = status.last_checkpoint or {}
            if value and newest.get("step") != value:
                status.last_checkpoint = {**newest, "step": value, "time": timestamp(now)}
            continue
        changed |= getattr(status, snake(key)) != value  # each is a Status field (a unit test says)
        setattr(status, snake(key), value)
    if status.epoch is not None and status.total_epochs is not None:
        status.progress = f"{status.epoch}/{status.total_epochs}"
    _mirror_dataset(status, {str(gauge.field): int(progress[gauge.name])
                             for gauge in DATASET_GAUGES if gauge.name in progress})
    if changed:  # an unchanged scrape writes nothing, so an idle poll costs no API write
        status.last_progress_time = timestamp(now)


def _work_lost(result: Plan, resume_step: Any) -> None:
    """Once the attempt after a restart says where it resumed (its progress, or its final summary): the
    steps the last one had done past that point, done again. At least: the last attempt's step is its
    summary's where it wrote one, else as last read (every progress interval), so it may have gone further."""
    failure = result.status.last_failure or {}
    if "lastStep" not in failure or "lostSteps" in failure or not in_range(resume_step):
        return
    lost = max(0, int(failure["lastStep"]) - int(resume_step))
    failure["lostSteps"] = lost
    result.events.append(Event("Normal" if lost == 0 else "Warning", "WorkLost", (
        f"attempt {max(0, int(result.status.attempt or 1) - 1)} lost at least {lost} step(s): last "
        f"seen at step {failure['lastStep']}, the next attempt resumed at step "
        f"{int(resume_step)}")))


def _checkpoints_skipped(result: Plan, old: Status) -> None:
    """A run that could not resume from the newest step checkpoint(s) says so once: they count steps of
    another world size or steps per epoch (an edit while suspended), so it resumed further back."""
    skipped = result.status.resume_skipped_checkpoints
    if not skipped or skipped == old.resume_skipped_checkpoints:
        return
    result.events.append(Event("Warning", "CheckpointSkipped", (
        f"this run could not resume from the {skipped} newest step checkpoint(s): they were made with "
        "another world size or steps per epoch (rank 0's log names them and the values), so it resumed "
        f"further back, at step {result.status.resume_step or 0} (0: from the start)")))


def _mirror_summary(status: Status, summary: dict[str, Any], total_epochs: int) -> None:
    status.summary = summary  # pods.parse_summary let only numbers a status can hold through

    # The last progress read may be an epoch old: the run's own final figures win.
    for key, gauge_key in summary_keys.FINAL_FIGURES.items():
        gauge, value = gauges.BY_KEY[gauge_key], summary.get(key)
        if in_range(value, gauge.top):
            setattr(status, snake(str(gauge.field)), gauge.kind(value))
    if summary.get(summary_keys.STATUS) == summary_keys.SUCCEEDED and is_count(status.steps_total):
        status.step = status.steps_total  # every step of the run was taken
    if isinstance(report := summary.get(summary_keys.DATASET), dict):
        counts = {str(gauge.field): report[gauge.summary_key] for gauge in DATASET_GAUGES
                  if gauge.summary_key and is_count(report.get(gauge.summary_key))}
        _mirror_dataset(status, counts, report.get("layout"))
    if is_count(epochs := summary.get(summary_keys.EPOCHS)):
        status.epoch = epochs
        status.total_epochs = total_epochs
        status.progress = f"{epochs}/{total_epochs}"
    status.eta_seconds = 0.0
