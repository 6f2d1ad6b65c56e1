"""Where a run's time goes (docs/trainer.md): the parts of this process's run (startup, train, eval,
checkpoint, restore) do not overlap and add up to the run's wall time; they are in the summary's
``time_seconds``, the ``stopped`` termination message, and rank 0's gauges."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from pets_contract import gauges
from pets_contract.env import PROCESS_STARTED
from pets_training.cli import stopped_summary
from pets_training.contract import mark_process_start, take_process_start
from pets_training.progress import TIME_PARTS, TIME_SHARES, MetricsServer, TimeSplit, summary_json
from pets_training.stepsave import StopRequest

from .helpers import PYTHON, free_port, read_json, run
from .test_step_checkpoints import TINY

pytestmark = pytest.mark.unit

# The run's time split, and where this run resumed (where the lost work starts): the operator reads each.
TIME_GAUGES = {gauge.name: gauge.key for gauge in (*gauges.group(gauges.TIME), gauges.BY_KEY["resume_step"])}


def test_the_split_charges_each_piece_once() -> None:
    split = TimeSplit(start=100.0)
    split.charge(now=101.0)  # before the first step: startup
    split.charge("restore", now=103.0)
    split.waited_for_input(103.5, now=104.0)  # the first batch: the loader's start, start-up's
    split.first_step_done(now=104.5)
    split.waited_for_input(104.5, now=104.75)  # the next batch: a share of train
    split.charge(now=106.0)  # after it: train
    split.charge("eval", now=106.5)
    split.charge("checkpoint", now=107.0)
    split.charge(now=110.0)
    assert split.seconds == {"startup": 2.5, "train": 4.5, "eval": 0.5, "checkpoint": 0.5, "restore": 2.0}
    assert sum(split.seconds.values()) == 110.0 - 100.0
    assert split.input_wait == 0.25
    assert split.rounded() == {**split.seconds, "train_input_wait": 0.25}
    assert list(split.rounded()) == [*TIME_PARTS, *TIME_SHARES] and TIME_SHARES == ("train_input_wait",)


def test_the_first_entry_point_marks_the_start_and_a_run_takes_it_once() -> None:
    env: dict[str, str] = {}
    mark_process_start(env, 1000.0)  # pets-launch
    mark_process_start(env, 1003.0)  # the `python -m pets_training` it starts keeps the launcher's time
    assert env == {PROCESS_STARTED: "1000.000"}
    assert take_process_start(env, 1007.5) == 7.5
    assert take_process_start(env, 1010.0) is None  # a second run in the process counts from its own start


@pytest.mark.parametrize("value", ["", "soon", "nan", "inf", "2000"])
def test_a_start_that_is_no_time_before_now_is_not_taken(value: str) -> None:
    assert take_process_start({PROCESS_STARTED: value}, 1000.0) is None


def test_the_time_gauges_are_the_trainers_own_and_served() -> None:
    port = free_port()
    server = MetricsServer(port)
    try:
        for i, key in enumerate(TIME_GAUGES.values()):
            server.set(key, i + 0.5)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        server.close()
    for i, name in enumerate(TIME_GAUGES):
        assert f"{name} {i + 0.5}" in body


def test_the_stopped_message_says_where_the_time_went() -> None:
    stop = StopRequest()
    stop.set("SIGTERM received")
    stop.stopped, stop.global_step, stop.checkpoint = True, 11, "epoch_1_step_3"
    stop.time_seconds = {"startup": 3.25, "train": 100.5, "eval": 4.0, "checkpoint": 0.75, "restore": 0.5}
    message = stopped_summary(stop)
    assert message["time_seconds"] == stop.time_seconds
    assert len(summary_json(message).encode()) < 1024  # far under the termination message's 4 KiB


# The tiny run of test_step_checkpoints (resnet10t, 32 px, batch 4, 2 epochs, an epoch checkpoint after
# each) on 2 x 800 images: 1280 for training, 320 steps per epoch, so that the parts (several seconds)
# outweigh the second after the epoch loop that no part counts. Timed around training_function in a
# child process; rank 0's gauges are read after every step.
STEPS = 320

RUNNER = """
import json, sys, time, urllib.request
from pets_training.train import training_function

settings = json.loads(sys.argv[1])
seen = []

def hook(step, images):
    body = urllib.request.urlopen(f"http://127.0.0.1:{settings['metrics_port']}/metrics", timeout=10)
    lines = body.read().decode().splitlines()
    seen.append({k: float(v) for k, v in (line.split() for line in lines if line.startswith("pets_"))})

start = time.perf_counter()
summary = training_function(settings, step_hook=hook)
wall = time.perf_counter() - start
print("RESULT " + json.dumps({"wall": wall, "summary": summary, "seen": seen}))
"""


@pytest.mark.timeout(200)
def test_a_runs_parts_add_up_to_its_wall_time_and_are_served(tmp_path: Path) -> None:
    settings = {**TINY, "synthetic_images_per_class": 800, "output_dir": str(tmp_path),
                "metrics_port": free_port()}
    output, _ = run([PYTHON, "-c", RUNNER, json.dumps(settings)], timeout=170)
    result = json.loads(output.split("RESULT ", 1)[1].splitlines()[0])
    wall, summary, seen = result["wall"], result["summary"], result["seen"]
    parts = summary["time_seconds"]
    assert read_json(tmp_path / "summary.json")["time_seconds"] == parts
    assert list(parts) == [*TIME_PARTS, *TIME_SHARES]
    assert all(seconds >= 0 for seconds in parts.values()), parts
    # no loader workers (one CPU a process here): the loop decodes its next batch itself, within train
    assert 0 < parts["train_input_wait"] < parts["train"], parts
    assert parts["restore"] == 0  # no --resume
    assert parts["train"] > 0 and parts["eval"] > 0 and parts["checkpoint"] > 0  # 2 evals, 2 saves
    assert 0 < parts["startup"] < wall
    # The parts do not overlap, so their sum is at most the wall time (+ the summary's rounding to 1 ms).
    # Not in any part: what follows the epoch loop, about a second here whatever the run's length
    # (model.safetensors; metrics.png, 0.4 s of it matplotlib's import; the summary that holds these
    # numbers; closing the metrics server, up to 0.5 s of its poll). The model build and data setup
    # before the first step are in startup. 80 %: that second is under 20 % of this run.
    total = sum(parts[part] for part in TIME_PARTS)
    assert 0.8 * wall <= total <= wall + 0.005, (total, wall, parts)

    # rank 0's gauges, read after every step
    assert len(seen) == 2 * STEPS
    assert {s["pets_resume_step"] for s in seen} == {0.0}
    assert {s["pets_restore_seconds"] for s in seen} == {0.0}
    assert {s["pets_startup_seconds"] for s in seen} == {seen[0]["pets_startup_seconds"]}  # set once
    assert abs(seen[0]["pets_startup_seconds"] - parts["startup"]) < 0.001
    train = [s["pets_train_seconds_total"] for s in seen]
    assert train[0] == 0 and train == sorted(train) and 0 < train[-1] <= parts["train"]
    waits = [s["pets_train_input_wait_seconds_total"] for s in seen]
    assert waits[0] == 0 and waits == sorted(waits) and 0 < waits[-1] <= parts["train_input_wait"] + 0.0005
    assert all(wait < spent for wait, spent in zip(waits[1:], train[1:], strict=True))
    # epoch 1's eval and checkpoint come before epoch 2's steps
    assert [s["pets_eval_seconds_total"] > 0 for s in seen] == [False] * STEPS + [True] * STEPS
    assert [s["pets_checkpoint_seconds_total"] > 0 for s in seen] == [False] * STEPS + [True] * STEPS
    assert "first training step done" in output


def test_a_run_started_by_an_entry_point_counts_its_startup_from_that_start(tmp_path: Path) -> None:
    """The entry point's imports (torch, timm, accelerate: seconds) are start-up, not time no part counts."""
    settings = {**TINY, "epochs": 1, "output_dir": str(tmp_path), "metrics_port": free_port()}
    now = time.time()
    output, seconds = run([PYTHON, "-c", RUNNER, json.dumps(settings)], timeout=170,
                          env={PROCESS_STARTED: f"{now - 600.0:.3f}"})  # an entry point 10 minutes ago
    result = json.loads(output.split("RESULT ", 1)[1].splitlines()[0])
    startup = result["summary"]["time_seconds"]["startup"]
    assert 600.0 <= startup <= 600.0 + seconds, (startup, seconds)  # the child's start and imports too
