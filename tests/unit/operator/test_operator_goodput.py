"""status.goodput: a training's wall time split into parts, across attempts, and the ratio kept."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from pets_operator import api, goodput, observe
from pets_operator.status_types import Status
from pets_operator.timestamps import timestamp
from test_operator_pods import NOW, body, failed, failed_job, job, plan, pod

pytestmark = pytest.mark.unit

CREATED = NOW - timedelta(seconds=100)
PARTS = ("waitingSeconds", "startupSeconds", "productiveSeconds", "lostSeconds", "evalSeconds",
         "checkpointSeconds", "restoreSeconds", "unaccountedSeconds")


def created(st: dict[str, Any] | Status | None = None) -> dict[str, Any]:
    b = body(st)
    b["metadata"]["creationTimestamp"] = "2026-01-02T03:02:25Z"  # CREATED
    return b


def at(seconds: float) -> Any:
    return CREATED + timedelta(seconds=seconds)


RUNNING = [pod(0, phase="Running"), pod(1, phase="Running")]


def gauges(step: int, resume: int, startup: float, train: float, eval_: float = 0.0, save: float = 0.0,
           restore: float = 0.0) -> dict[str, float]:
    return {"pets_step": float(step), "pets_resume_step": float(resume), "pets_startup_seconds": startup,
            "pets_train_seconds_total": train, "pets_eval_seconds_total": eval_,
            "pets_checkpoint_seconds_total": save, "pets_restore_seconds": restore}


def test_a_training_with_one_restart_adds_up_to_its_wall_time_part_by_part() -> None:
    # Seen 2 s after its creation, pods pending until 10 s: 10 s waiting.
    p = plan(created(), job(active=2), [pod(0), pod(1)], now=at(2))
    assert p.status.phase == api.PENDING
    p = plan(created(p.status), job(active=2), RUNNING, now=at(10), progress=gauges(1, 0, 5.0, 0.0))
    assert p.status.phase == api.RUNNING and p.status.goodput["waitingSeconds"] == 10.0
    p = plan(created(p.status), job(active=2), RUNNING, now=at(60),
             progress=gauges(41, 0, 5.0, 40.0, save=1.0))
    # Killed at 62 s, last read at step 41; restarting until its next attempt runs at 70 s.
    gang = [failed(0, 137, "2026-01-02T03:03:27Z"), failed(1, 1, "2026-01-02T03:03:27Z")]
    p = plan(created(p.status), failed_job(), gang, now=at(62))
    assert p.status.phase == api.RESTARTING and p.status.last_failure["lastStep"] == 41
    # It resumed at step 31: 10 steps done again, at attempt 0's 40 s / 40 steps after its first.
    p = plan(created(p.status), job(active=2, attempt=1), RUNNING, now=at(70),
             progress=gauges(32, 31, 6.0, 0.0, restore=1.0))
    assert p.status.last_failure["lostSteps"] == 10
    book = p.status.goodput
    assert book["attempts"][0]["lostSeconds"] == 10.0 and book["waitingSeconds"] == 18.0
    done = job(attempt=1, succeeded=2, conditions=[{"type": "Complete", "status": "True"}])
    split = {"startup": 6.0, "train": 40.0, "eval": 2.0, "checkpoint": 1.0, "restore": 1.0}
    summary = {"status": "succeeded", "epochs": 5, "resume_step": 31, "time_seconds": split}
    p = plan(created(p.status), done, [], now=at(120), summary=summary)
    assert p.status.phase == api.SUCCEEDED
    book = p.status.goodput
    assert {key: book[key] for key in (*PARTS, "wallSeconds", "ratio")} == {
        "waitingSeconds": 18.0, "startupSeconds": 11.0, "productiveSeconds": 70.0, "lostSeconds": 10.0,
        "evalSeconds": 2.0, "checkpointSeconds": 2.0, "restoreSeconds": 1.0, "unaccountedSeconds": 6.0,
        "wallSeconds": 120.0, "ratio": round(70 / 120, 4)}
    assert sum(book[key] for key in PARTS) == pytest.approx(book["wallSeconds"])
    assert [a["attempt"] for a in book["attempts"]] == [0, 1]
    # Finished: nothing moves any more, however late it is looked at.
    later = plan(created(p.status), done, [], now=at(500), summary=summary)
    assert later.status.goodput == book
    declared(book, api.STATUS_SCHEMA["properties"]["goodput"], "status.goodput")


def test_the_wait_ends_when_rank_0_started_not_when_the_operator_saw_the_gang_running() -> None:
    """The trainer's start-up counts from its container's start, imports included: the wait stops there."""
    p = plan(created(), job(active=2), [pod(0), pod(1)], now=at(2))
    p = plan(created(p.status), job(active=2), RUNNING, now=at(10), rank0_running_since=timestamp(at(7)),
             progress=gauges(1, 0, 3.0, 0.0))
    assert p.status.phase == api.RUNNING and p.status.goodput["waitingSeconds"] == 7.0
    assert p.status.goodput["phaseSince"] == timestamp(at(7))
    # A start from before the wait began is another run's: the wait ends when the gang was seen running.
    status = Status()
    goodput.begin(status, timestamp(at(0)), at(0))
    goodput.book_phase(status, None, api.PENDING, at(1))
    goodput.book_phase(status, api.PENDING, api.RUNNING, at(9), rank0_started=timestamp(at(-5)))
    assert status.goodput["bookedWaitingSeconds"] == 9.0


def test_an_idle_poll_writes_nothing() -> None:
    made = {"children": {"job": "pets", "networkPolicy": "pets"}}
    p = plan(created(made), job(active=2), RUNNING, now=at(10), progress=gauges(5, 0, 3.0, 2.0))
    again = plan(created(p.status), job(active=2), RUNNING, now=at(40), progress=gauges(5, 0, 3.0, 2.0))
    assert again.status.to_dict() == p.status.to_dict()
    moved = plan(created(p.status), job(active=2), RUNNING, now=at(40), progress=gauges(9, 0, 3.0, 6.0))
    assert moved.status.goodput["asOf"] == "2026-01-02T03:03:05Z"
    assert moved.status.goodput["productiveSeconds"] == 6.0


def test_time_queued_or_suspended_is_waiting() -> None:
    status = Status()
    goodput.begin(status, "2026-01-02T03:02:25Z", at(1))
    goodput.book_phase(status, None, api.QUEUED, at(1))
    goodput.book_phase(status, api.QUEUED, api.RUNNING, at(31))
    goodput.book_phase(status, api.RUNNING, api.SUSPENDED, at(50))
    goodput.book_phase(status, api.SUSPENDED, api.RUNNING, at(65))
    goodput.book_phase(status, api.RUNNING, api.RUNNING, at(80))
    assert status.goodput["bookedWaitingSeconds"] == 1 + 30 + 15


def test_a_kueue_preemption_ends_a_run_of_the_same_attempt_and_its_lost_steps_are_counted() -> None:
    """Kueue suspends the workload (its pods stop, after a save on SIGTERM) and resumes it: the same
    attempt, a second run of the trainer, told apart by when rank 0's container started."""
    status = Status()
    goodput.read_attempt(status, 0, "2026-01-02T03:00:00Z", gauges(51, 0, 5.0, 25.0, save=0.5))
    goodput.read_attempt(status, 0, "2026-01-02T03:05:00Z", gauges(51, 49, 4.0, 0.0, restore=0.8))
    goodput.read_attempt(status, 0, "2026-01-02T03:05:00Z", gauges(80, 49, 4.0, 14.5, restore=0.8))
    first, second = status.goodput["attempts"]
    assert (first["attempt"], second["attempt"]) == (0, 0)
    assert (first["lostSteps"], first["lostSeconds"]) == (2, 1.0)  # 25 s over its 50 steps after the first
    assert (second["firstStep"], second["lastStep"], second["trainSeconds"]) == (49, 80, 14.5)
    goodput.account(Status(), replace(status, phase=api.RUNNING), "2026-01-02T02:59:50Z", NOW)
    assert status.goodput["lostSeconds"] == 1.0 and status.goodput["productiveSeconds"] == 38.5


def test_values_out_of_range_are_not_read() -> None:
    status = Status()
    junk = {"pets_train_seconds_total": -1.0, "pets_startup_seconds": float("nan"),
            "pets_eval_seconds_total": True, "pets_restore_seconds": 2.0**60}
    goodput.read_attempt(status, 0, None, junk)
    assert status.goodput["attempts"] == [{"attempt": 0}]


def test_only_the_newest_attempts_are_kept_and_older_ones_are_added_up() -> None:
    status = Status()
    for attempt in range(goodput.ATTEMPTS_KEPT + 3):
        goodput.read_attempt(status, attempt, None, {"pets_train_seconds_total": 10.0})
    book = status.goodput
    assert len(book["attempts"]) == goodput.ATTEMPTS_KEPT and book["attempts"][0]["attempt"] == 3
    assert book["earlier"] == {"trainSeconds": 30.0}


def declared(value: Any, schema: dict[str, Any], path: str) -> None:
    """`value` is what the CRD's schema declares (the API server would prune an undeclared field)."""
    kind = schema.get("type")
    if kind == "object" and "properties" in schema:
        assert isinstance(value, dict), path
        for key, item in value.items():
            assert key in schema["properties"], f"{path}.{key} is not in the CRD's schema"
            declared(item, schema["properties"][key], f"{path}.{key}")
    elif kind == "array":
        assert isinstance(value, list) and len(value) <= schema.get("maxItems", len(value)), path
        for item in value:
            declared(item, schema["items"], f"{path}[]")
    else:
        types = {"number": (int, float), "integer": (int,), "string": (str,)}[kind]
        assert isinstance(value, types) and not isinstance(value, bool), f"{path}: {value!r} is no {kind}"


def test_every_field_written_is_in_the_crds_schema() -> None:
    status = Status()
    for attempt in range(goodput.ATTEMPTS_KEPT + 2):
        goodput.read_attempt(status, attempt, "2026-01-02T03:02:30Z",
                             gauges(10 * attempt + 5, 10 * attempt - 2, 1.0, 2.0, 0.5, 0.1, 0.2))
    goodput.begin(status, "2026-01-02T03:02:25Z", at(1))
    goodput.book_phase(status, None, api.PENDING, at(2))
    goodput.account(Status(), replace(status, phase=api.RUNNING), "2026-01-02T03:02:25Z", at(300))
    declared(status.goodput, api.STATUS_SCHEMA["properties"]["goodput"], "status.goodput")


def test_a_run_that_could_not_use_the_newest_step_checkpoint_says_so_once() -> None:
    """Made with another world size (replicas edited while suspended): it resumed further back."""
    reading = {"pets_resume_step": 40.0, "pets_step": 41.0, "pets_resume_skipped_checkpoints": 2.0}
    p = plan(created(), job(active=2), RUNNING, now=at(10), progress=reading)
    assert p.status.resume_skipped_checkpoints == 2
    (event,) = [e for e in p.events if e.reason == "CheckpointSkipped"]
    assert event.type == "Warning" and "the 2 newest step checkpoint(s)" in event.message
    assert "another world size or steps per epoch" in event.message and "at step 40" in event.message
    later = {**reading, "pets_step": 45.0}
    again = plan(created(p.status), job(active=2), RUNNING, now=at(20), progress=later)
    assert not [e for e in again.events if e.reason == "CheckpointSkipped"]
    # A run that finished before a progress read: its summary says it.
    done = job(succeeded=2, conditions=[{"type": "Complete", "status": "True"}])
    summary = {"status": "succeeded", "epochs": 5, "resume_step": 40, "resume_skipped_checkpoints": 1}
    finished = plan(created(), done, [], now=at(30), summary=summary)
    assert finished.status.resume_skipped_checkpoints == 1
    assert [e.reason for e in finished.events].count("CheckpointSkipped") == 1


def test_a_run_booked_only_by_its_summary_is_a_run_of_its_own() -> None:
    """A Kueue preemption late in a training: the second run of the same attempt finishes between two
    reads, so only its summary books it, told apart from the first by its container's start."""
    status = Status()
    goodput.read_attempt(status, 0, "2026-01-02T03:00:00Z", gauges(100, 0, 5.0, 30.0))
    split = {"startup": 6.0, "train": 2.8, "eval": 0.5, "checkpoint": 0.1, "restore": 0.1}
    goodput.read_summary(status, 0, "2026-01-02T03:01:00Z", {"resume_step": 100, "time_seconds": split})
    first, second = status.goodput["attempts"]
    assert (first["firstStep"], first["lastStep"], first["trainSeconds"]) == (0, 100, 30.0)
    assert (second["firstStep"], second["trainSeconds"]) == (100, 2.8)
    assert second["startedAt"] == "2026-01-02T03:01:00Z"


def test_a_run_is_listed_once_rank_0_runs_before_any_progress_read() -> None:
    """A resize or a preemption may stop a run before the first read of its gauges: it is listed from its
    container's start, its time unaccounted."""
    p = plan(created(), job(active=2), RUNNING, now=at(10), rank0_running_since=timestamp(at(7)))
    assert p.status.goodput["attempts"] == [{"attempt": 0, "startedAt": timestamp(at(7)), "worldSize": 2}]


def test_a_finished_rank_0_says_when_its_container_started() -> None:
    """What books a run that ended before any read: the start of rank 0's terminated container."""
    ended = pod(0, phase="Succeeded", terminated={"exitCode": 0, "startedAt": "2026-01-02T03:01:00Z"})
    assert observe.observe_rank0(ended, api.RUNNING, None, ("ns", "pets")).rank0_running_since == \
        "2026-01-02T03:01:00Z"


def test_a_run_that_ended_before_any_progress_read_has_its_world_size_from_the_summary() -> None:
    """A short last run (a resize's, say) can finish between two reads: only its summary books it."""
    done = job(succeeded=2, conditions=[{"type": "Complete", "status": "True"}])
    split = {"startup": 1.0, "train": 4.0, "eval": 0.5, "checkpoint": 0.1, "restore": 0.0}
    finished = plan(created(), done, [], now=at(30),
                    summary={"status": "succeeded", "epochs": 5, "resume_step": 0, "time_seconds": split})
    (run,) = finished.status.goodput["attempts"]
    assert run["worldSize"] == 2 and run["trainSeconds"] == 4.0


DONE = job(succeeded=2, conditions=[{"type": "Complete", "status": "True"}])


def test_a_finished_run_s_last_step_is_its_summary_s_not_the_last_read() -> None:
    """Read at step 218 (a read every 10 s), the run went on to take all 240 steps: its summary's
    global_step is exact. A summary from a trainer older than that key leaves the last read's."""
    p = plan(created(), job(active=2), RUNNING, now=at(60), progress=gauges(218, 0, 5.0, 50.0))
    split = {"startup": 5.0, "train": 55.0, "eval": 1.0, "checkpoint": 0.1, "restore": 0.0}
    older = {"status": "succeeded", "epochs": 5, "resume_step": 0, "time_seconds": split}
    finished = plan(created(p.status), DONE, [], now=at(70), summary={**older, "global_step": 240})
    assert finished.status.phase == api.SUCCEEDED
    (run,) = finished.status.goodput["attempts"]
    assert (run["firstStep"], run["lastStep"], run["trainSeconds"]) == (0, 240, 55.0)
    (run,) = plan(created(p.status), DONE, [], now=at(70), summary=older).status.goodput["attempts"]
    assert run["lastStep"] == 218
    for junk in (-1, True, 2.0**60, "240", 239.5):  # not a step a status can hold: the read's stays
        (run,) = goodput_of(p.status, {**older, "global_step": junk})["attempts"]
        assert run["lastStep"] == 218, junk


def goodput_of(status: Status, summary: dict[str, Any]) -> dict[str, Any]:
    book: dict[str, Any] = plan(created(status), DONE, [], now=at(70), summary=summary).status.goodput
    return book


def test_a_failed_run_s_summary_step_is_its_last_step_and_the_work_lost_counts_from_it() -> None:
    """Read at step 41, the attempt crashed at step 45 (its failure summary says so, without a time
    split): lastFailure.lastStep and the run's lastStep are 45, and the next attempt, resumed at 31, lost
    14 steps, not 10."""
    p = plan(created(), job(active=2), RUNNING, now=at(60), progress=gauges(41, 0, 5.0, 40.0))
    summary = {"status": "failed", "error": "RuntimeError: CUDA error", "global_step": 45}
    gang = [failed(0, 1, "2026-01-02T03:03:27Z", message=json.dumps(summary)),
            failed(1, 1, "2026-01-02T03:03:27Z")]
    p = plan(created(p.status), failed_job(), gang, now=at(62), summary=summary)
    assert p.status.phase == api.RESTARTING and p.status.last_failure["lastStep"] == 45
    assert p.status.goodput["attempts"][0]["lastStep"] == 45
    p = plan(created(p.status), job(active=2, attempt=1), RUNNING, now=at(70),
             progress=gauges(32, 31, 6.0, 0.0, restore=1.0))
    first = p.status.goodput["attempts"][0]
    assert p.status.last_failure["lostSteps"] == first["lostSteps"] == 14
    # its train time as last read (a failure summary has no split) over its 44 steps after the first
    assert first["lostSeconds"] == round(40.0 * 14 / 44, 3)
    (event,) = [e for e in p.events if e.reason == "WorkLost"]
    assert "lost at least 14 step(s): last seen at step 45" in event.message
    # A summary without the step (a failure before the training loop, an older trainer): as last read.
    old = {"status": "failed", "error": "RuntimeError: CUDA error"}
    gang = [failed(0, 1, "2026-01-02T03:03:27Z", message=json.dumps(old)),
            failed(1, 1, "2026-01-02T03:03:27Z")]
    before = plan(created(), job(active=2), RUNNING, now=at(60), progress=gauges(41, 0, 5.0, 40.0))
    p = plan(created(before.status), failed_job(), gang, now=at(62), summary=old)
    assert p.status.last_failure["lastStep"] == p.status.goodput["attempts"][0]["lastStep"] == 41


def test_a_failed_run_s_summary_split_is_booked_and_prices_its_lost_steps() -> None:
    """The trainer's failure summary carries its time split too: the run's train time is its own (44 s,
    not 40 s as last read), so its lost steps cost 44 s * 14 / 44 steps."""
    p = plan(created(), job(active=2), RUNNING, now=at(60), progress=gauges(41, 0, 5.0, 40.0))
    times = {"startup": 5.0, "train": 44.0, "eval": 0.0, "checkpoint": 0.0, "restore": 0.0}
    summary = {"status": "failed", "error": "RuntimeError: CUDA error", "global_step": 45,
               "time_seconds": times}
    gang = [failed(0, 1, "2026-01-02T03:03:27Z", message=json.dumps(summary)),
            failed(1, 1, "2026-01-02T03:03:27Z")]
    p = plan(created(p.status), failed_job(), gang, now=at(62), summary=summary)
    first = p.status.goodput["attempts"][0]
    assert (first["trainSeconds"], first["lastStep"]) == (44.0, 45), first
    p = plan(created(p.status), job(active=2, attempt=1), RUNNING, now=at(70),
             progress=gauges(32, 31, 6.0, 0.0, restore=1.0))
    first = p.status.goodput["attempts"][0]
    assert (first["lostSteps"], first["lostSeconds"]) == (14, 14.0), first


def test_the_wait_for_input_is_a_share_of_training_read_then_summed() -> None:
    """The trainer's train_input_wait is booked beside each run's train time, from the gauge as read and
    then the summary, and added up; it is inside productive, so the ratio and the parts do not change. A
    trainer older than the gauge says nothing, and neither does the book."""
    reading = {**gauges(100, 0, 5.0, 30.0), "pets_train_input_wait_seconds_total": 6.0}
    p = plan(created(), job(active=2), RUNNING, now=at(60), progress=reading)
    assert p.status.goodput["attempts"][0]["inputWaitSeconds"] == 6.0
    assert p.status.goodput["inputWaitSeconds"] == 6.0
    split = {"startup": 5.0, "train": 55.0, "eval": 1.0, "checkpoint": 0.1, "restore": 0.0}
    book = goodput_of(p.status, {"status": "succeeded", "epochs": 5, "resume_step": 0, "global_step": 240,
                                 "time_seconds": {**split, "train_input_wait": 11.5}})
    assert (book["attempts"][0]["inputWaitSeconds"], book["inputWaitSeconds"]) == (11.5, 11.5)
    older = goodput_of(created(), {"status": "succeeded", "epochs": 5, "resume_step": 0,
                                   "time_seconds": split})
    assert "inputWaitSeconds" not in older and "inputWaitSeconds" not in older["attempts"][0]
    assert (book["productiveSeconds"], book["ratio"]) == (older["productiveSeconds"], older["ratio"])
