"""The line `make demo` prints while a training runs: only measured figures, and what is happening."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pets_client.progress import live_line, time_split_line

pytestmark = pytest.mark.unit

PROGRESS_PY = Path(__file__).resolve().parents[3] / "src" / "pets_client" / "progress.py"


def test_no_status_yet_prints_nothing() -> None:
    assert live_line({}) is None


def test_running_before_the_first_step_says_so_and_shows_no_zeros() -> None:
    # What the operator wrote before the trainer's first step (spec-derived totals only).
    status = {"phase": "Running", "replicas": 2, "readyReplicas": 2, "totalEpochs": 5}
    assert live_line(status) == "Running: 2/2 pods, waiting for the first step"


def test_running_within_the_first_epoch_shows_steps_only() -> None:
    status = {"phase": "Running", "replicas": 2, "readyReplicas": 2, "totalEpochs": 5, "step": 7,
              "stepsTotal": 50}
    assert live_line(status) == "Running: 2/2 pods, step 7/50"


def test_after_an_epoch_the_metrics_follow() -> None:
    status = {"phase": "Running", "replicas": 2, "readyReplicas": 2, "totalEpochs": 5, "step": 12,
              "stepsTotal": 50, "epoch": 1, "trainLoss": 1.23456, "evalAccuracy": 0.5,
              "imagesPerSecond": 20.04, "etaSeconds": 99.6}
    assert live_line(status) == ("Running: 2/2 pods, step 12/50, epoch 1/5, loss 1.2346, acc 50.0%, "
                                 "img/s 20.0, eta 100s")


def test_pending_shows_the_reason_and_succeeded_ends_with_a_colon() -> None:
    assert live_line({"phase": "Pending", "message": "waiting for the Job's pods"}) == \
        "Pending: waiting for the Job's pods"
    done = {"phase": "Succeeded", "epoch": 5, "totalEpochs": 5, "evalAccuracy": 0.994, "etaSeconds": 0}
    assert live_line(done) == "Succeeded: epoch 5/5, acc 99.4%"
    assert live_line({"phase": "Failed", "restarts": 2, "message": "rank 1 exited 1"}) == \
        "Failed: restarts 2, rank 1 exited 1"


def test_the_file_runs_on_the_standard_library_alone(tmp_path: Path) -> None:
    # make demo runs it with the host's python3 before any venv: -I -S keeps site-packages out.
    training = {"status": {"phase": "Running", "replicas": 1, "readyReplicas": 0}}
    out = subprocess.run([sys.executable, "-I", "-S", str(PROGRESS_PY)], input=json.dumps(training),
                         capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout == "Running: 0/1 pods, waiting for the first step\n"


def test_pods_count_the_active_ones_while_the_ready_count_lags() -> None:
    status = {"phase": "Running", "replicas": 2, "readyReplicas": 0, "activeReplicas": 2}
    assert live_line(status) == "Running: 2/2 pods, waiting for the first step"


def test_the_time_split_names_each_part_that_took_time_in_the_readers_order() -> None:
    # status.goodput of the resize e2e's training (2026-11-28), as the operator booked it.
    book = {"ratio": 0.3223, "wallSeconds": 103, "productiveSeconds": 33.199, "startupSeconds": 11.377,
            "evalSeconds": 9.272, "checkpointSeconds": 0.193, "restoreSeconds": 0.065, "lostSeconds": 0,
            "resizingSeconds": 12.943, "waitingSeconds": 6.425, "unaccountedSeconds": 29.526}
    assert time_split_line({"goodput": book}) == (
        "goodput 0.32 of 103 s: training 33.2 s, start-up 11.4 s, evaluation 9.3 s, checkpoints 0.2 s, "
        "restores 0.1 s, resizing 12.9 s, waiting 6.4 s, unaccounted 29.5 s")
    assert time_split_line({}) is None and time_split_line({"goodput": {"ratio": 0.5}}) is None
    # the wait for input is a share of the training time: said beside it, when it took any
    waited = time_split_line({"goodput": {**book, "inputWaitSeconds": 4.04}}) or ""
    assert waited.startswith(
        "goodput 0.32 of 103 s: training 33.2 s (waiting for input 4.0 s), start-up 11.4 s")
    brief = {"goodput": {**book, "inputWaitSeconds": 0.01}}
    assert time_split_line(brief) == time_split_line({"goodput": book})


def test_make_demo_prints_the_time_split_with_the_host_python_alone() -> None:
    training = {"status": {"goodput": {"ratio": 0.8, "wallSeconds": 50, "productiveSeconds": 40,
                                       "startupSeconds": 10}}}
    out = subprocess.run([sys.executable, "-I", "-S", str(PROGRESS_PY), "--time-split"],
                         input=json.dumps(training), capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout == "goodput 0.80 of 50 s: training 40.0 s, start-up 10.0 s\n"
