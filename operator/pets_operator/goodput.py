"""status.goodput: where a training's wall time went, and the share of it that was training it kept.

Pure bookkeeping on the typed status (time is passed in). Each part is defined once, here and in
docs/operator.md ("Preemption and goodput"):

- wall: from the PetsTraining's creation to its completion (or to `asOf`, while it runs).
- waiting: the operator's phases Pending, Queued, Suspended, Preempted and Restarting, booked when the
  phase changes (and from the creation to the first phase); a wait ends in Running when rank 0's
  container started.
- resizing: those phases while a resize is under way (status.resize): the old gang's drain and the new
  one's start, up to its pods running (resize.py). Each run says its world size.
- startup, train, eval, checkpoint, restore: each run's own split (an attempt, or the part of it
  between a Kueue preemption or a suspension and the next), from rank 0's gauges
  (pets_startup_seconds, pets_train_seconds_total, pets_eval_seconds_total,
  pets_checkpoint_seconds_total, pets_restore_seconds) as last read, or its final summary. Its lastStep
  likewise: the step gauge as last read, the summary's global_step once it ended (older trainers: none).
- inputWait: the share of train the training loop waited for its next batch (the trainer's
  train_input_wait): how much the input pipeline held the steps back. Within productive and lost, not a
  part of its own.
- lost: the training time of steps done again after a run ended (a restart, a Kueue preemption, a
  suspension): the steps a run had done past the point the next one resumed at, times that run's
  seconds per step. Part of its train time.
- productive: train less lost. The ratio is productive / wall.
- unaccounted: wall less all the others: the trainer's end and the pod's, a dead attempt's last seconds
  after its last read, the operator's reaction time.

The totals are made again only when an input changed (a phase, an attempt's parts), so an idle poll
writes nothing: `asOf` says when they were made.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pets_contract import gauges
from pets_contract import goodput as totals
from pets_contract import summary as summary_keys
from pets_operator import api
from pets_operator.progress import in_range, summary_step
from pets_operator.status_types import Status
from pets_operator.timestamps import parse_timestamp, timestamp

WAITING_PHASES = (api.PENDING, api.QUEUED, api.SUSPENDED, api.PREEMPTED, api.RESTARTING)
# rank 0's gauges of a run's time split: each feeds its attempt's field, from the gauge or the summary
TIME_GAUGES = tuple(gauge for gauge in gauges.group(gauges.TIME) if gauge.field and gauge.summary_key)
ATTEMPTS_KEPT = 10  # older attempts are added into `earlier`


def _seconds(value: Any) -> float | None:
    return round(float(value), 3) if in_range(value) else None


def _book(status: Status) -> dict[str, Any]:
    if status.goodput is None:
        status.goodput = {}
    return status.goodput


def begin(status: Status, created: str | None, now: datetime) -> None:
    """The first round: the wait is counted from the creation (the operator may see it later)."""
    _book(status).setdefault("phaseSince", created or timestamp(now))


def book_phase(status: Status, old_phase: str | None, phase: str, now: datetime,
               rank0_started: str | None = None) -> None:
    """At a phase change: the time spent in a waiting phase (or before the first phase) is waiting. Into
    Running, the wait ends when rank 0's container started (the trainer's start-up counts from there), not
    when the operator saw the gang running."""
    if phase == old_phase:
        return
    book = _book(status)
    since = parse_timestamp(book["phaseSince"]) if book.get("phaseSince") else None
    end = now
    if since and phase == api.RUNNING and rank0_started:
        started = parse_timestamp(rank0_started)
        if since <= started < now:
            end = started
    if since and (old_phase is None or old_phase in WAITING_PHASES):
        waited = max(0.0, (end - since).total_seconds())
        key = "bookedResizingSeconds" if status.resize else "bookedWaitingSeconds"
        book[key] = round(float(book.get(key) or 0.0) + waited, 3)
    book["phaseSince"] = timestamp(end)


def _entry(book: dict[str, Any], attempt: int, started: str | None) -> dict[str, Any]:
    """The entry of one run of the trainer: an attempt, or a part of one (a Kueue preemption or a
    suspension stops its pods, and the same attempt's workload starts new ones), told apart by when rank
    0's container started (None: the newest run of that attempt)."""
    runs = book.setdefault("attempts", [])
    run = next((run for run in reversed(runs) if run.get("attempt") == attempt), None)
    if run is None or (started is not None and run.get("startedAt") not in (None, started)):  # a new run
        run = {"attempt": attempt}
        runs.append(run)
        if len(runs) > ATTEMPTS_KEPT:
            earlier = book.setdefault("earlier", {})
            for key, value in runs.pop(0).items():
                if key.endswith("Seconds"):
                    earlier[key] = round(float(earlier.get(key) or 0.0) + float(value), 3)
    if started is not None:
        run["startedAt"] = started
    return run


def _resumed_at(book: dict[str, Any], run: dict[str, Any], first_step: int) -> None:
    """A run says where it resumed: the run before it lost the steps it had done past that point (its
    summary's step, else as last read, so at least that many), at its own seconds per step."""
    if "firstStep" in run:
        return
    run["firstStep"] = first_step
    runs = book["attempts"]
    index = runs.index(run)
    if index == 0 or "lastStep" not in runs[index - 1]:
        return
    before = runs[index - 1]
    lost = max(0, int(before["lastStep"]) - first_step)
    # Its first step is in its startup: its train time is that of the steps after it.
    steps = int(before["lastStep"]) - int(before.get("firstStep") or 0) - 1
    train = float(before.get("trainSeconds") or 0.0)
    before["lostSteps"] = lost
    before["lostSeconds"] = round(min(train, lost * train / steps), 3) if steps > 0 else 0.0


def _read(status: Status, attempt: int, started: str | None, times: dict[str, Any],
          first_step: Any) -> dict[str, Any]:
    """One run's split (`times`: each part's field -> the value read) and the step it resumed at."""
    run = _entry(_book(status), attempt, started)
    if status.replicas:  # the world size it runs at
        run["worldSize"] = int(status.replicas)
    run.update({key: value for key, raw in times.items() if (value := _seconds(raw)) is not None})
    if (first := _seconds(first_step)) is not None:
        _resumed_at(_book(status), run, int(first))
    return run


def read_attempt(status: Status, attempt: int, started: str | None,
                 progress: dict[str, float]) -> None:
    """Rank 0's gauges of this run, as read now."""
    run = _read(status, attempt, started, {str(g.field): progress.get(g.name) for g in TIME_GAUGES},
                progress.get(gauges.BY_KEY["resume_step"].name))
    if (last := _seconds(progress.get(gauges.BY_KEY["step"].name))) is not None:
        run["lastStep"] = int(last)


def read_summary(status: Status, attempt: int, started: str | None, summary: dict[str, Any]) -> None:
    """A run's final summary (its termination message; `started`: when its container started): its whole
    split and the step it reached, more exact than a read (an older trainer's summary has no step: the
    last read's stays)."""
    times = summary.get(summary_keys.TIME_SECONDS)
    step = summary_step(summary)
    if not isinstance(times, dict) and step is None:  # e.g. a failure before the training loop
        return
    # a run that ended before any progress read has only its summary
    parts = {str(g.field): times.get(g.summary_key) for g in TIME_GAUGES} if isinstance(times, dict) else {}
    run = _read(status, attempt, started, parts, summary.get(summary_keys.RESUME_STEP))
    if step is not None:
        run["lastStep"] = step


def account(old: Status, status: Status, created: str | None, now: datetime) -> None:
    """The totals and the ratio, made again when an input changed since `old` (the status before)."""
    book = status.goodput
    if not book:
        return
    inputs = ("attempts", "earlier", "bookedWaitingSeconds", "bookedResizingSeconds", "phaseSince")
    before = old.goodput or {}
    if all(before.get(key) == book.get(key) for key in inputs) and totals.RATIO in before and \
            old.phase == status.phase:
        return
    end = now
    if status.phase in api.FINISHED_PHASES and status.completion_time:
        end = min(now, parse_timestamp(status.completion_time))
    start = parse_timestamp(created) if created else end
    wall = max(0.0, (end - start).total_seconds())
    waiting = float(book.get("bookedWaitingSeconds") or 0.0)
    resizing = float(book.get("bookedResizingSeconds") or 0.0)
    if status.phase in WAITING_PHASES and book.get("phaseSince"):
        now_waiting = max(0.0, (end - parse_timestamp(book["phaseSince"])).total_seconds())
        if status.resize:
            resizing += now_waiting
        else:
            waiting += now_waiting
    entries = [*book.get("attempts", []), book.get("earlier") or {}]

    def total(key: str) -> float:
        return sum(float(entry.get(key) or 0.0) for entry in entries)

    parts = {totals.WAITING: waiting, totals.RESIZING: resizing, totals.STARTUP: total("startupSeconds"),
             totals.PRODUCTIVE: total("trainSeconds") - total("lostSeconds"),
             totals.LOST: total("lostSeconds"), totals.EVAL: total("evalSeconds"),
             totals.CHECKPOINT: total("checkpointSeconds"), totals.RESTORE: total("restoreSeconds")}
    parts[totals.UNACCOUNTED] = wall - sum(parts.values())
    book.update({key: round(value, 3) for key, value in parts.items()})
    if any("inputWaitSeconds" in entry for entry in entries):  # older trainers do not say it
        book[totals.INPUT_WAIT] = round(total("inputWaitSeconds"), 3)
    book[totals.WALL] = round(wall, 3)
    book[totals.RATIO] = round(parts[totals.PRODUCTIVE] / wall, 4) if wall > 0 else 0.0
    book["asOf"] = timestamp(end)
