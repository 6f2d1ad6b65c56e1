"""Step checkpoints (``--checkpoint-interval-seconds``): their names and order, the agreement of the ranks on
when to save and stop, and for real (tiny runs in child processes, so each has a fresh accelerate state):
step checkpoints appear mid-epoch, and a run stopped mid-epoch and resumed ends with the same weights,
bit for bit, as a run never stopped."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pets_contract.exits import STOPPED
from pets_training.checkpoint import (
    STATE_FILE,
    checkpoint_name,
    list_checkpoints,
    list_positions,
    read_trainer_state,
    save_atomically,
    temp_name,
)
from pets_training.config import ConfigError, resolve
from pets_training.stepsave import SaveClock, StopRequest, agree, decide

from .helpers import BIN, PYTHON, read_json, read_jsonl, run, sigterm_after_first_step, trainer_flags

pytestmark = pytest.mark.unit


def _save(directory: Path, epoch: int, step: int = 0, keep: int = 3) -> Path:
    def save_state(path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "model.safetensors").write_text(f"weights {epoch}.{step}")

    return save_atomically(directory, epoch, save_state, {"at": [epoch, step]}, True, lambda: None, keep,
                           step=step)


def test_step_checkpoints_are_named_by_their_position_and_sort_with_the_epoch_ones(tmp_path: Path) -> None:
    assert checkpoint_name(3) == "epoch_3" and checkpoint_name(3, 40) == "epoch_3_step_40"
    assert temp_name(0, "host", 5) == ".tmp-epoch_0_step_5-host"
    # (epochs done, steps of the next): step 10 of epoch 1 comes after step 9, and before epoch_1;
    # names alone would sort epoch_0_step_10 before epoch_0_step_9
    for epoch, step in [(0, 9), (0, 10), (1, 0), (1, 2)]:
        _save(tmp_path, epoch, step, keep=10)
    assert [p for p, _ in list_positions(tmp_path)] == [(0, 9), (0, 10), (1, 0), (1, 2)]
    assert [e for e, _ in list_checkpoints(tmp_path)] == [1]  # the epoch ones alone, as before
    assert read_trainer_state(tmp_path / "epoch_1_step_2") == {"at": [1, 2]}


def test_keep_counts_both_kinds_and_keeps_the_newest(tmp_path: Path) -> None:
    _save(tmp_path, 1)
    _save(tmp_path, 1, 4)
    _save(tmp_path, 1, 8)
    _save(tmp_path, 1, 12)  # keep 3: epoch_1 is the oldest now
    assert [p for p, _ in list_positions(tmp_path)] == [(1, 4), (1, 8), (1, 12)]
    _save(tmp_path, 2)
    assert [p for p, _ in list_positions(tmp_path)] == [(1, 8), (1, 12), (2, 0)]


def test_rank_0_decides_the_save_and_anyone_the_stop() -> None:
    assert agree([(True, False), (False, False)]) == (True, False)
    assert agree([(False, False), (True, False)]) == (False, False)  # another rank's clock does not count
    assert agree([(False, False), (False, True), (False, False)]) == (False, True)
    assert agree([(True, True)]) == (True, True)
    with pytest.raises(ValueError):
        agree([])
    assert decide(True, False, True, 1) == (True, False)  # one process: no collective


def test_the_save_clock() -> None:
    clock = SaveClock(10.0)
    clock.start(now=100.0)
    assert not clock.due(now=109.9) and clock.due(now=110.0)
    off = SaveClock(0.0)
    off.start(now=0.0)
    assert not off.due(now=1e9)
    stop = StopRequest()
    assert not stop.requested
    stop.set("SIGTERM")
    assert stop.requested and stop.reason == "SIGTERM"


def test_the_interval_flag() -> None:
    assert resolve([]).checkpoint_interval_seconds == 0.0  # off by default
    assert resolve(["--checkpoint-interval-seconds", "30"]).checkpoint_interval_seconds == 30.0
    with pytest.raises(ConfigError, match="checkpoint_interval_seconds must be 0 \\(off\\) or more, got -1"):
        resolve(["--checkpoint-interval-seconds", "-1"])


# A tiny run in a child process: resnet10t at 32 px, 2 classes x 20 images -> 32 for training, batch 4:
# 8 steps per epoch, 2 epochs. fp32, no DataLoader workers, one thread: the same arithmetic every time.
TINY: dict[str, object] = {
    "model": "resnet10t",
    "image_size": 32,
    "synthetic_classes": 2,
    "synthetic_images_per_class": 20,
    "epochs": 2,
    "batch_size": 4,
    "eval_batch_size": 8,
    "mixed_precision": "no",
    "num_workers": 0,
    "threads": 1,
    "pretrained": False,  # no internet here
    "log_every": 1000,
}

RUNNER = """
import json, sys
from pets_training.stepsave import StopRequest
from pets_training.train import training_function

settings, stop_at = json.loads(sys.argv[1]), int(sys.argv[2])
stop = StopRequest()

def hook(step, images):
    if step == stop_at:
        stop.set("the test asked at step %d" % step)

training_function(settings, step_hook=hook, stop=stop)
"""


def _train(settings: dict[str, object], stop_at: int = 0) -> str:
    output, _ = run([PYTHON, "-c", RUNNER, json.dumps(settings), str(stop_at)], timeout=170)
    return output


@pytest.mark.timeout(200)
def test_step_checkpoints_are_saved_by_time_mid_epoch(tmp_path: Path) -> None:
    # an interval shorter than any step: a step checkpoint after every step, then the epoch one
    output = _train({**TINY, "output_dir": str(tmp_path), "checkpoint_interval_seconds": 1e-6,
                     "keep_checkpoints": 3})
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["epoch_1_step_7", "epoch_1_step_8", "epoch_2"], names
    saved = read_trainer_state(tmp_path / "checkpoints" / "epoch_1_step_7")
    assert saved["position"] == {"epoch": 1, "steps": 7, "samples": 28, "epoch_samples": 32,
                                 "global_step": 15, "world_size": 1, "accumulation": 1, "steps_per_epoch": 8}
    assert (saved["format"], saved["global_batch"], saved["epochs"]) == (2, 4, 2)
    assert [r["epoch"] for r in saved["history"]] == [1]
    assert "checkpoint epoch_0_step_1 saved (global step 1): training blocked" in output
    assert "checkpoint epoch_1_step_8 saved (global step 16)" in output
    assert "checkpoint epoch_2 saved (global step 16)" in output
    summary = read_json(tmp_path / "summary.json")
    assert summary["status"] == "succeeded" and summary["global_step"] == 16  # where it ended, exactly


@pytest.mark.timeout(300)
def test_a_run_stopped_mid_epoch_resumes_to_the_same_weights_bit_for_bit(tmp_path: Path) -> None:
    """Exact, not within a tolerance: the order of epoch 2 is seeded by the epoch (EpochShuffleSampler), its
    crops by (seed, epoch, image), the skipped steps are skipped (skip_first_batches), and load_state
    restores the model, Adam's moments, OneCycle's position and the random states: the resumed steps
    compute what the uninterrupted ones did, in fp32 on one CPU thread."""
    full = _train({**TINY, "output_dir": str(tmp_path / "full")})

    resumed = {**TINY, "output_dir": str(tmp_path / "resumed"), "resume": True}
    first = _train(resumed, stop_at=11)  # 8 steps per epoch: step 3 of epoch 2
    assert "checkpoint epoch_1_step_3 saved (global step 11)" in first
    assert "stopped at global step 11 (the test asked at step 11)" in first
    assert not (tmp_path / "resumed" / "summary.json").exists()
    assert sorted(p.name for p in (tmp_path / "resumed" / "checkpoints").iterdir()) == [
        "epoch_1", "epoch_1_step_3"
    ]
    second = _train(resumed)
    assert "resume: continuing at epoch 2 step 3 (global step 11) from " in second
    assert "epoch_1_step_3" in second.split("resume: continuing at", 1)[1].splitlines()[0]

    a = load_file(str(tmp_path / "full" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "model.safetensors"))
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"tensors that differ after the resume: {differ}"
    # the resumed epoch reports the whole epoch's loss (its sums before the save were kept), exactly
    def losses(run: str) -> list[float]:
        return [r["train_loss"] for r in read_jsonl(tmp_path / run / "progress.jsonl")]

    assert losses("full") == losses("resumed")
    summary = read_json(tmp_path / "resumed" / "summary.json")
    assert summary["epochs"] == 2
    assert summary["time_seconds"]["restore"] > 0  # the second run's: load_state and the skip's setup
    assert "first training step done" in full


@pytest.mark.timeout(200)
def test_sigterm_saves_a_step_checkpoint_and_exits_75(tmp_path: Path) -> None:
    """The pod's entrypoint (one process: it trains in itself) gets SIGTERM mid-epoch: it finishes the
    step, saves a step checkpoint, exits 75; the next start resumes at that step."""
    # 2 x 200 images -> 320 for training, batch 4: 80 steps per epoch, no step checkpoints by time
    settings = {**TINY, "synthetic_images_per_class": 200, "epochs": 3, "output_dir": str(tmp_path),
                "summary_path": str(tmp_path / "termination-log")}
    env = {k: v for k, v in os.environ.items() if k != "PETS_EXIT_CODE_FILE"}
    code, output = sigterm_after_first_step([str(BIN / "pets-launch"), *trainer_flags(settings)], env,
                                            tmp_path / "first.log", 120)
    assert code == STOPPED == 75, output[-3000:]
    assert "stopped (SIGTERM received): exit 75" in output
    positions = [p for p, _ in list_positions(tmp_path / "checkpoints")]
    assert len(positions) == 1 and positions[0][0] == 0 and 0 < positions[0][1] < 80, positions
    steps = positions[0][1]
    assert not (tmp_path / "summary.json").exists()  # the finish's; the termination message says why
    message = read_json(tmp_path / "termination-log")
    assert message["status"] == "stopped" and message["exit_code"] == 75 and message["global_step"] == steps
    assert message["checkpoint"] == f"epoch_0_step_{steps}" and "SIGTERM received" in message["error"]
    parts = message["time_seconds"]  # where this run's time went, up to the stop
    assert list(parts) == ["startup", "train", "eval", "checkpoint", "restore", "train_input_wait"]
    assert parts["startup"] > 0 and parts["checkpoint"] > 0 and parts["eval"] == 0, parts
    # A share of it, up to the stop too (a SIGTERM at the first step can leave both near 0 ms).
    assert 0 <= parts["train_input_wait"] <= parts["train"], parts

    second, _ = run([str(BIN / "pets-launch"), *trainer_flags(settings), "--max-train-steps", "1"],
                    timeout=120, env={"PETS_EXIT_CODE_FILE": ""})
    assert f"resume: continuing at epoch 1 step {steps} (global step {steps}) from " in second


def _as_format_1(checkpoint: Path, world_size: int) -> None:
    """Rewrite a checkpoint's trainer_state.json as v0.1.0 wrote it (format 1: no format, global batch or
    sample counts; a step position in steps of its own world size). The state files are the same."""
    state_file = checkpoint / STATE_FILE
    saved = json.loads(state_file.read_text())
    for key in ("format", "global_batch", "epochs", "epoch_sample_counts"):
        saved.pop(key, None)
    saved["fingerprint"]["epochs"] = 2  # v0.1.0's fingerprint held it
    if "position" in saved:
        p = saved["position"]
        saved["position"] = {"epoch": p["epoch"], "steps": p["steps"], "global_step": p["global_step"],
                             "steps_per_epoch": 8 // world_size, "world_size": world_size}
    state_file.write_text(json.dumps(saved))


@pytest.mark.timeout(300)
def test_a_format_1_step_checkpoint_resumes_at_its_own_world_size(tmp_path: Path) -> None:
    """A checkpoint of v0.1.0 continues as it did: at its step, the epoch's sample counts unknown."""
    settings = {**TINY, "output_dir": str(tmp_path), "resume": True}
    _train(settings, stop_at=11)  # 8 steps per epoch: epoch_1 and epoch_1_step_3
    for name in ("epoch_1", "epoch_1_step_3"):
        _as_format_1(tmp_path / "checkpoints" / name, 1)
    second = _train(settings)
    assert "resume: continuing at epoch 2 step 3 (global step 11) from " in second
    assert "sample 12 of 32, made at world size 1, now 1" in second
    summary = read_json(tmp_path / "summary.json")
    assert (summary["resume_step"], summary["resume_skipped_checkpoints"]) == (11, 0)
    assert summary["samples_inexact_epochs"] == [] and summary["global_batch_size"] == 4
    progress = read_jsonl(tmp_path / "progress.jsonl")
    assert (progress[0]["samples_trained"], progress[0]["samples_distinct"]) == (32, 32)
    assert "samples_trained" not in progress[1]  # its first 3 steps were counted by nobody


@pytest.mark.timeout(300)
def test_a_format_1_step_checkpoint_of_another_world_size_is_skipped_and_counted(tmp_path: Path) -> None:
    """Its position counts steps of 2 processes: this 1-process run resumes from the epoch checkpoint
    before it instead, says so in one line (the checkpoint, its format, the fallback), and counts it in the
    summary (the operator's resumeSkippedCheckpoints and Event)."""
    settings = {**TINY, "output_dir": str(tmp_path), "resume": True}
    _train(settings, stop_at=11)  # 8 steps per epoch: epoch_1 and epoch_1_step_3
    _as_format_1(tmp_path / "checkpoints" / "epoch_1_step_3", 2)
    _as_format_1(tmp_path / "checkpoints" / "epoch_1", 2)
    second = _train(settings)
    skipped = [line for line in second.splitlines() if "resume: skipping" in line]
    assert len(skipped) == 1, second
    assert f"resume: skipping step checkpoint {tmp_path / 'checkpoints' / 'epoch_1_step_3'} (format 1): " \
        "format 1 (v0.1.0: its position counts steps of its own world size) was made with world_size=2, " \
        "this run has world_size=1; falling back to the newest epoch checkpoint that fits, else a fresh " \
        "start" in skipped[0]
    assert "resume: continuing after epoch 1 from " in second
    summary = read_json(tmp_path / "summary.json")
    assert (summary["resume_step"], summary["resume_skipped_checkpoints"]) == (8, 1)


@pytest.mark.timeout(300)
def test_a_resume_with_more_epochs_continues_and_one_with_fewer_than_done_is_refused(tmp_path: Path) -> None:
    """``epochs`` is not in the fingerprint: a finished 1-epoch run resumed with 2 trains one more epoch,
    its schedule the 2-epoch one at the same sample position; fewer epochs than done is an error."""
    settings = {**TINY, "output_dir": str(tmp_path), "resume": True, "epochs": 1}
    _train(settings)
    longer = _train({**settings, "epochs": 2})
    assert "resume: continuing after epoch 1 from " in longer
    summary = read_json(tmp_path / "summary.json")
    assert (summary["epochs"], summary["resume_step"], summary["samples_inexact_epochs"]) == (2, 8, [])
    progress = read_jsonl(tmp_path / "progress.jsonl")
    assert [(r["epoch"], r["total_epochs"]) for r in progress] == [(1, 1), (2, 2)]
    proc = subprocess.run([PYTHON, "-c", RUNNER, json.dumps(settings), "0"], capture_output=True, text=True,
                          timeout=170)
    assert proc.returncode != 0
    assert "has 2 epochs done, more than epochs 1: give at least 2" in proc.stdout + proc.stderr
