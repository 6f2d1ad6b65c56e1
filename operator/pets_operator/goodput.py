"""status.goodput: where a training's wall time went, and the share of it that was training it kept.

Pure bookkeeping on the status dict (time is passed in). Each part is defined once, here and in
docs/operator.md ("Preemption and goodput"):

- wall: from the PetsTraining's creation to its completion (or to `asOf`, while it runs).
- waiting: the operator's phases Pending, Queued, Suspended, Preempted and Restarting, booked when the
  phase changes (and from the creation to the first phase).
- startup, train, eval, checkpoint, restore: each attempt's own split, from rank 0's gauges
  (pets_startup_seconds, pets_train_seconds_total, pets_eval_seconds_total,
  pets_checkpoint_seconds_total, pets_restore_seconds) as last read, or its final summary.
- lost: the training time of steps done again after a restart: the lost steps of an attempt times
  that attempt's seconds per step. Part of its train time.
- productive: train less lost. The ratio is productive / wall.
- unaccounted: wall less all the others: process start and imports before the trainer's clock, the
  pod's end, a dead attempt's last seconds after its last read, the operator's reaction time.

The totals are made again only when an input changed (a phase, an attempt's parts), so an idle poll
writes nothing: `asOf` says when they were made.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pets_operator import api
from pets_operator.backends import parse_timestamp, timestamp

WAITING_PHASES = (api.PENDING, api.QUEUED, api.SUSPENDED, api.PREEMPTED, api.RESTARTING)
# rank 0's gauge -> (the attempt's field, the summary's time_seconds key)
TRAINER_PARTS = {
    "pets_startup_seconds": ("startupSeconds", "startup"),
    "pets_train_seconds_total": ("trainSeconds", "train"),
    "pets_eval_seconds_total": ("evalSeconds", "eval"),
    "pets_checkpoint_seconds_total": ("checkpointSeconds", "checkpoint"),
    "pets_restore_seconds": ("restoreSeconds", "restore"),
}
ATTEMPTS_KEPT = 10  # older attempts are added into `earlier`
SECONDS_TOP = 2.0**53


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return round(float(value), 3) if 0 <= value <= SECONDS_TOP else None


def begin(status: dict[str, Any], created: str | None, now: datetime) -> None:
    """The first round: the wait is counted from the creation (the operator may see it later)."""
    book = status.setdefault("goodput", {})
    book.setdefault("phaseSince", created or timestamp(now))


def book_phase(status: dict[str, Any], old_phase: str | None, phase: str, now: datetime) -> None:
    """At a phase change: the time spent in a waiting phase (or before the first phase) is waiting."""
    if phase == old_phase:
        return
    book = status.setdefault("goodput", {})
    since = book.get("phaseSince")
    if since and (old_phase is None or old_phase in WAITING_PHASES):
        waited = max(0.0, (now - parse_timestamp(since)).total_seconds())
        book["bookedWaitingSeconds"] = round(float(book.get("bookedWaitingSeconds") or 0.0) + waited, 3)
    book["phaseSince"] = timestamp(now)


def _attempt(book: dict[str, Any], attempt: int) -> dict[str, Any]:
    attempts = book.setdefault("attempts", [])
    for entry in attempts:
        if entry.get("attempt") == attempt:
            return entry
    entry = {"attempt": attempt}
    attempts.append(entry)
    if len(attempts) > ATTEMPTS_KEPT:
        earlier = book.setdefault("earlier", {})
        for key, value in attempts.pop(0).items():
            if key.endswith("Seconds"):
                earlier[key] = round(float(earlier.get(key) or 0.0) + float(value), 3)
    return entry


def read_attempt(status: dict[str, Any], attempt: int, progress: dict[str, float]) -> None:
    """Rank 0's gauges of this attempt, as read now."""
    entry = _attempt(status.setdefault("goodput", {}), attempt)
    for metric, (key, _summary_key) in TRAINER_PARTS.items():
        if (value := _seconds(progress.get(metric))) is not None:
            entry[key] = value
    if (first := _seconds(progress.get("pets_resume_step"))) is not None:
        entry["firstStep"] = int(first)
    if (last := _seconds(progress.get("pets_step"))) is not None:
        entry["lastStep"] = int(last)


def read_summary(status: dict[str, Any], attempt: int, summary: dict[str, Any]) -> None:
    """The attempt's final summary (its termination message): its whole split, more exact than a read."""
    times = summary.get("time_seconds")
    if not isinstance(times, dict):
        return
    entry = _attempt(status.setdefault("goodput", {}), attempt)
    for key, summary_key in TRAINER_PARTS.values():
        if (value := _seconds(times.get(summary_key))) is not None:
            entry[key] = value
    if (first := _seconds(summary.get("resume_step"))) is not None:
        entry["firstStep"] = int(first)


def book_lost(status: dict[str, Any], attempt: int, lost_steps: int) -> None:
    """`lost_steps` of `attempt` were done again: their time, at that attempt's seconds per step."""
    entry = _attempt(status.setdefault("goodput", {}), attempt)
    # Its first step is in its startup: the train time is that of the steps after it.
    steps = int(entry.get("lastStep") or 0) - int(entry.get("firstStep") or 0) - 1
    train = float(entry.get("trainSeconds") or 0.0)
    entry["lostSteps"] = lost_steps
    entry["lostSeconds"] = round(min(train, lost_steps * train / steps), 3) if steps > 0 else 0.0


def account(old: dict[str, Any], status: dict[str, Any], created: str | None, now: datetime) -> None:
    """The totals and the ratio, made again when an input changed since `old` (the status before)."""
    book = status.get("goodput")
    if not book:
        return
    inputs = ("attempts", "earlier", "bookedWaitingSeconds", "phaseSince")
    before = old.get("goodput") or {}
    if all(before.get(key) == book.get(key) for key in inputs) and "ratio" in before and \
            old.get("phase") == status.get("phase"):
        return
    end = now
    if status.get("phase") in api.FINISHED_PHASES and status.get("completionTime"):
        end = min(now, parse_timestamp(status["completionTime"]))
    start = parse_timestamp(created) if created else end
    wall = max(0.0, (end - start).total_seconds())
    waiting = float(book.get("bookedWaitingSeconds") or 0.0)
    if status.get("phase") in WAITING_PHASES and book.get("phaseSince"):
        waiting += max(0.0, (end - parse_timestamp(book["phaseSince"])).total_seconds())
    entries = [*book.get("attempts", []), book.get("earlier") or {}]

    def total(key: str) -> float:
        return sum(float(entry.get(key) or 0.0) for entry in entries)

    parts = {"waitingSeconds": waiting, "startupSeconds": total("startupSeconds"),
             "productiveSeconds": total("trainSeconds") - total("lostSeconds"),
             "lostSeconds": total("lostSeconds"), "evalSeconds": total("evalSeconds"),
             "checkpointSeconds": total("checkpointSeconds"), "restoreSeconds": total("restoreSeconds")}
    parts["unaccountedSeconds"] = wall - sum(parts.values())
    book.update({key: round(value, 3) for key, value in parts.items()})
    book["wallSeconds"] = round(wall, 3)
    book["ratio"] = round(parts["productiveSeconds"] / wall, 4) if wall > 0 else 0.0
    book["asOf"] = timestamp(end)
