"""A training resized while it runs, for real: 2 processes (`accelerate launch`, gloo on the CPU) stopped by
SIGTERM mid-epoch with a step checkpoint, resumed on 1 process (gradient accumulation 2) and stopped again
mid-epoch, then resumed on 2 processes to the end. Every epoch trains each sample once (the trainer's
counts), and the model is the one an unresized run makes, up to the order of floating-point sums and the
BatchNorm running statistics (each rank's own; DDP broadcasts rank 0's)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from safetensors.torch import load_file

from pets_training.checkpoint import list_positions

from .helpers import (
    BIN,
    PYTHON,
    free_port,
    read_json,
    read_jsonl,
    run,
    sigterm_after_first_step,
    trainer_flags,
)

pytestmark = pytest.mark.unit

# resnet10t at 32 px, 4 classes x 41 images: 131 for training. batch_size 8 at 2 processes: a global batch
# of 16, 9 optimizer steps an epoch, the last of 3 samples (one short chunk: at 2 processes rank 1 pads,
# at 1 process the second micro-step is left out). fp32, one thread, no workers: the same sums each time.
SETTINGS: dict[str, object] = {
    "model": "resnet10t",
    "image_size": 32,
    "synthetic_classes": 4,
    "synthetic_images_per_class": 41,
    "epochs": 3,
    "batch_size": 8,
    "eval_batch_size": 16,
    "mixed_precision": "no",
    "num_workers": 0,
    "threads": 1,
    "pretrained": False,
    "log_every": 1000,
    "resume": True,
}
TRAIN_SAMPLES = 131

RUNNER = """
import json, os, signal, sys
from pets_training.stepsave import StopRequest
from pets_training.train import training_function

settings, stop_at = json.loads(sys.argv[1]), int(sys.argv[2])
stop = StopRequest()
signal.signal(signal.SIGTERM, stop.on_signal)  # as pets-launch does: finish the step, save, stop

def hook(step, images):
    if step == stop_at and os.environ.get("RANK", "0") == "0":
        os.kill(os.getpid(), signal.SIGTERM)  # rank 0 alone is told; the others agree at this step

training_function(settings, step_hook=hook, stop=stop)
"""


def _train(tmp_path: Path, output: Path, processes: int, stop_at: int = 0) -> str:
    runner = tmp_path / "runner.py"
    runner.write_text(RUNNER)
    settings = json.dumps({**SETTINGS, "output_dir": str(output)})
    launch = [PYTHON] if processes == 1 else [
        str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", str(processes), "--num_machines",
        "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
    ]  # fmt: skip
    out, _ = run([*launch, str(runner), settings, str(stop_at)], timeout=200)
    return out


@pytest.mark.timeout(600)
def test_a_training_resized_2_1_2_mid_epoch_trains_each_sample_once_to_the_same_model(tmp_path: Path) -> None:
    _train(tmp_path, tmp_path / "unresized", 2)

    resized = tmp_path / "resized"
    first = _train(tmp_path, resized, 2, stop_at=4)  # step 4 of epoch 1: 64 of its 131 samples
    assert "stopped at global step 4 (SIGTERM received)" in first
    second = _train(tmp_path, resized, 1, stop_at=14)  # step 5 of epoch 2
    assert "global batch 16 (recorded in " in second
    assert "1 process(es) x batch_size 8 x 2 accumulation step(s)" in second
    assert "resume: continuing at epoch 1 step 4 (global step 4) from " in second
    assert "sample 64 of 131, made at world size 2, now 1" in second
    assert "stopped at global step 14 (SIGTERM received)" in second
    third = _train(tmp_path, resized, 2)
    assert "sample 80 of 131, made at world size 1, now 2" in third

    summary = read_json(resized / "summary.json")
    expected = read_json(tmp_path / "unresized" / "summary.json")
    assert summary["status"] == "succeeded" and summary["world_size"] == 2
    assert summary["global_batch_size"] == expected["global_batch_size"] == 16
    assert summary["samples_inexact_epochs"] == [] == expected["samples_inexact_epochs"]
    progress = read_jsonl(resized / "progress.jsonl")
    assert [(r["samples_trained"], r["samples_distinct"]) for r in progress] == [(TRAIN_SAMPLES,) * 2] * 3

    a = load_file(str(tmp_path / "unresized" / "model.safetensors"))
    b = load_file(str(resized / "model.safetensors"))
    trained = ("fc.weight", "fc.bias")
    differences = {k: float((a[k] - b[k]).abs().max()) for k in trained}
    scale = {k: float(a[k].abs().max()) for k in trained}
    accuracy = (expected["final_accuracy"], summary["final_accuracy"])
    losses = [(r["train_loss"], s["train_loss"])
              for r, s in zip(read_jsonl(tmp_path / "unresized" / "progress.jsonl"), progress, strict=True)]
    print(f"\nresized 2 -> 1 -> 2: accuracy {accuracy[1]:.4f} (unresized {accuracy[0]:.4f}); train losses "
          f"{losses}; classifier max abs difference {differences} of max abs {scale}")
    # the same model math: the classifier within 1e-3 of its size and the losses within 1e-3 (measured: equal
    # to the bit); the accuracy within one eval image (measured: one differs, 0.9697 against 0.9394), since
    # evaluation reads the BatchNorm running statistics, which each rank updates from the chunks it sees
    for k in trained:
        assert differences[k] <= 1e-3 * scale[k], (k, differences, scale)
    for unresized_loss, resized_loss in losses:
        assert resized_loss == pytest.approx(unresized_loss, rel=1e-3, abs=1e-4)
    assert abs(accuracy[0] - accuracy[1]) <= 1 / 33 + 1e-9  # 33 eval images: at most one differs


@pytest.mark.timeout(300)
def test_sigterm_to_a_two_process_pod_with_loader_workers_saves_a_step_checkpoint_and_exits_75(
    tmp_path: Path,
) -> None:
    """The drain of a resize where a pod runs several processes: torchrun sends SIGTERM to each rank's
    process group, which its DataLoader workers have left (test_inputs.py checks that a worker outlives
    one), so each rank gets the batch it is reading, finishes its step, and the ranks save one step
    checkpoint together and exit 75. The bench's resize, whose ranks mostly wait for batches, failed so
    before; here the signal may also find them between batches."""
    settings = {**SETTINGS, "synthetic_images_per_class": 200, "num_workers": 1, "resume": False,
                "output_dir": str(tmp_path), "summary_path": str(tmp_path / "termination-log")}
    env = {k: v for k, v in os.environ.items() if k != "PETS_EXIT_CODE_FILE"}
    env.update(PETS_PROCS_PER_MACHINE="2", PETS_MAIN_PORT=str(free_port()))
    code, output = sigterm_after_first_step([str(BIN / "pets-launch"), *trainer_flags(settings)], env,
                                            tmp_path / "launch.log", 200)
    assert code == 75, output[-4000:]
    assert "training failed" not in output, output[-4000:]
    stopped = read_json(tmp_path / "termination-log")
    assert stopped["status"] == "stopped" and stopped["exit_code"] == 75
    names = [path.name for _, path in list_positions(tmp_path / "checkpoints")]
    assert names[-1] == stopped["checkpoint"], (names, stopped)  # a step one, or the epoch's if it came late
