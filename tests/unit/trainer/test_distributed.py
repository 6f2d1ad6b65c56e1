"""The trainer for real: `accelerate launch` with 2 processes, two `pets-launch` machines on localhost,
resume after an interrupt, the gather difference, notebook_launcher, and bad input end to end."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from safetensors.torch import load_file

from .helpers import BIN, PYTHON, SMALL_ARGS, free_port, read_json, read_jsonl, run

pytestmark = pytest.mark.unit

HERE = Path(__file__).parent


def _accelerate_launch(port: int) -> list[str]:
    # `accelerate launch --cpu --num_processes 2` starts ONE process unless an MPI launcher is configured;
    # `--multi_gpu` uses torchrun, and the trainer picks the CPU and gloo itself when there is no GPU.
    return [
        str(BIN / "accelerate"),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "bf16",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(port),
    ]


@pytest.mark.timeout(300)
def test_two_process_accelerate_launch_learns_the_easy_set(tmp_path: Path) -> None:
    out = tmp_path / "out"
    metrics_port = free_port()
    cmd = [
        *_accelerate_launch(free_port()),
        "-m",
        "pets_training",
        *SMALL_ARGS,
        "--output-dir",
        str(out),
        "--metrics-port",
        str(metrics_port),
        "--summary-path",
        str(tmp_path / "termination-log"),
    ]
    output, seconds = run(cmd, timeout=280)
    summary = read_json(out / "summary.json")
    print(f"\n2-process accelerate launch: accuracy {summary['final_accuracy']:.4f} in {seconds:.1f} s wall")
    # No wall-clock assertion: on a busy machine it fails a correct run; timeout(300) bounds a hang.
    assert summary["status"] == "succeeded" and summary["world_size"] == 2
    assert summary["final_accuracy"] >= 0.90, output[-3000:]
    assert read_json(tmp_path / "termination-log") == summary
    assert len((tmp_path / "termination-log").read_bytes()) < 4096
    progress = read_jsonl(out / "progress.jsonl")
    assert [r["epoch"] for r in progress] == [1, 2, 3]
    assert set(progress[0]) == {
        "epoch",
        "total_epochs",
        "train_loss",
        "eval_accuracy",
        "images_per_second",
        "elapsed_seconds",
        "eta_seconds",
        "samples_trained",
        "samples_distinct",
    }
    assert [(r["samples_trained"], r["samples_distinct"]) for r in progress] == [(256, 256)] * 3
    assert progress[-1]["eta_seconds"] == 0 and progress[0]["eta_seconds"] > 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["epoch_2", "epoch_3"]  # keep 2
    weights = load_file(str(out / "model.safetensors"))
    assert weights["fc.weight"].shape == (4, 512)
    assert (out / "metrics.png").stat().st_size > 1000
    assert "mixed precision bf16" in output and "epoch 3/3: train loss" in output
    assert "serving Prometheus metrics on port" in output  # rank 0 only: rank 1 binding it too would crash
    assert "rank 0 of 2 ready: machine 0, local rank 0" in output
    assert "rank 1 of 2 ready: machine 0, local rank 1" in output  # every rank logs this line


@pytest.mark.timeout(240)
def test_gather_for_metrics_does_not_count_padding(tmp_path: Path) -> None:
    cmd = [*_accelerate_launch(free_port()), str(HERE / "gather_probe.py")]
    output, _ = run(cmd, timeout=230)
    result = json.loads(output.split("RESULT ", 1)[1].splitlines()[0])
    assert result["world"] == 2 and result["eval_size"] == 9
    plain_correct, plain_count = result["plain"]
    correct, count = result["metrics"]
    assert count == 9  # every eval image once
    assert plain_count > 9  # the tutorial's gather also counts the samples repeated to fill the last batch
    assert correct <= count and plain_correct <= plain_count
    # the eval store (each process's shard padded and masked to the training batch's shape) counts the same
    assert result["store"] == result["metrics"]
    assert result["store_shapes"] == [[4, 3, 32, 32]]  # 5 and 4 images: 2 batches of 4 on each process


@pytest.mark.timeout(400)
def test_resume_after_an_interrupt_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    """Tolerance: every epoch's train loss within 1e-4 and eval accuracy within one eval image; final
    classifier weights within 1e-3. (The crops are seeded per sample and epoch, so in practice equal.)"""
    args = [*SMALL_ARGS, "--threads", "1", "--num-workers", "1"]
    run([PYTHON, "-m", "pets_training", *args, "--output-dir", str(tmp_path / "full")], timeout=180)

    env = {"PETS_OUTPUT_DIR": str(tmp_path / "resumed")}
    first, _ = run([str(BIN / "pets-launch"), *args, "--max-epochs-this-run", "1"], timeout=180, env=env)
    assert "one process in total: training in this process" in first
    assert "no complete checkpoint" in first and "stopping after epoch 1" in first
    assert not (tmp_path / "resumed" / "summary.json").exists()
    second, _ = run([str(BIN / "pets-launch"), *args], timeout=180, env=env)
    assert "resume: continuing after epoch 1" in second

    full = read_jsonl(tmp_path / "full" / "progress.jsonl")
    resumed = read_jsonl(tmp_path / "resumed" / "progress.jsonl")
    assert [r["epoch"] for r in resumed] == [1, 2, 3]
    eval_size = 64
    for a, b in zip(full, resumed, strict=True):
        assert abs(a["train_loss"] - b["train_loss"]) <= 1e-4, (a, b)
        assert abs(a["eval_accuracy"] - b["eval_accuracy"]) <= 1 / eval_size + 1e-9, (a, b)
    wa = load_file(str(tmp_path / "full" / "model.safetensors"))["fc.weight"]
    wb = load_file(str(tmp_path / "resumed" / "model.safetensors"))["fc.weight"]
    assert (wa - wb).abs().max().item() <= 1e-3
    assert read_json(tmp_path / "resumed" / "summary.json")["epochs"] == 3


@pytest.mark.timeout(300)
def test_two_pets_launch_machines_on_localhost_train_one_model(tmp_path: Path) -> None:
    port = free_port()
    procs = []
    for index in (0, 1):
        env = {
            **os.environ,
            "PETS_NUM_MACHINES": "2",
            "JOB_COMPLETION_INDEX": str(index),
            "PETS_MAIN_ADDR": "127.0.0.1",
            "PETS_MAIN_PORT": str(port),
            "PETS_CPU_LIMIT": "1",
            "PETS_OUTPUT_DIR": str(tmp_path / f"machine{index}"),
        }
        procs.append(
            subprocess.Popen(
                [str(BIN / "pets-launch"), *SMALL_ARGS],
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=280)[0])
        finally:
            proc.kill()
    for index, (proc, output) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0, f"machine {index}:\n{output[-5000:]}"
    assert "--machine_rank 0" in outputs[0] and "--machine_rank 1" in outputs[1]
    assert "rank 1 of 2 ready: machine 1, local rank 0" in outputs[1]
    summary = read_json(tmp_path / "machine0" / "summary.json")
    assert summary["world_size"] == 2 and summary["final_accuracy"] >= 0.9
    assert not (tmp_path / "machine1" / "summary.json").exists()  # rank 0 reports
    # every machine keeps its own complete checkpoints, so a restarted pod can resume from its own disk
    assert "is not shared by every machine: each machine writes its own copy" in outputs[0]
    for index in (0, 1):
        assert (tmp_path / f"machine{index}" / "checkpoints" / "epoch_3" / "trainer_state.json").is_file()


NOTEBOOK = """
import json, sys
from accelerate import notebook_launcher
from pets_training.train import training_function

settings = json.loads(sys.argv[1])
notebook_launcher(training_function, (settings,), num_processes=2, use_port=sys.argv[2])
"""


@pytest.mark.timeout(240)
def test_notebook_launcher_runs_the_training_function_on_two_cpu_processes(tmp_path: Path) -> None:
    settings = {
        "model": "resnet10t",
        "image_size": 64,
        "synthetic_classes": 4,
        "synthetic_images_per_class": 80,
        "epochs": 3,
        "batch_size": 16,
        "eval_batch_size": 32,
        "mixed_precision": "bf16",
        "output_dir": str(tmp_path),
        "checkpoints": False,
        "pretrained": False,
    }
    output, _ = run([PYTHON, "-c", NOTEBOOK, json.dumps(settings), str(free_port())], timeout=230)
    assert "Launching training on 2" in output  # accelerate names the device after the torch build
    summary = read_json(tmp_path / "summary.json")
    assert summary["world_size"] == 2 and summary["final_accuracy"] >= 0.9


@pytest.mark.timeout(120)
def test_bad_input_fails_with_a_clear_error_and_a_failed_summary(tmp_path: Path) -> None:
    summary_path = tmp_path / "termination-log"
    proc = subprocess.run(
        [
            PYTHON,
            "-m",
            "pets_training",
            "--data",
            str(tmp_path / "nope"),
            "--summary-path",
            str(summary_path),
            "--output-dir",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 78, proc.stderr[-3000:]  # permanent: a restart cannot fix it
    assert f"data: directory '{tmp_path / 'nope'}' does not exist" in proc.stderr
    assert read_json(summary_path) == {
        "status": "failed",
        "error": f"data: directory '{tmp_path / 'nope'}' does not exist",
    }
    proc = subprocess.run(
        [str(BIN / "pets-launch")],
        env={**os.environ, "PETS_NUM_MACHINES": "two"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "PETS_NUM_MACHINES must be an integer, got 'two'" in proc.stderr
