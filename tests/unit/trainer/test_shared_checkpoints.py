"""Two machines (one process each) sharing one checkpoint directory, as pods sharing a ReadWriteMany
claim do: one copy of each checkpoint, written and published by rank 0, with every rank's random states,
and a resume that gives every rank its own state back (docs/trainer.md, "Checkpoints and resume")."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pets_training.checkpoint import SHARE_PROBE

from .helpers import BIN, free_port

pytestmark = pytest.mark.unit

HERE = Path(__file__).parent

# test_checkpoint_fence's TINY, 2 epochs: 12 training images -> 3 steps per epoch on 2 ranks of batch 2
SETTINGS = {
    "model": "resnet10t",
    "image_size": 32,
    "synthetic_classes": 2,
    "synthetic_images_per_class": 8,
    "batch_size": 2,
    "eval_batch_size": 4,
    "mixed_precision": "no",
    "num_workers": 0,
    "threads": 1,
    "pretrained": False,
    "epochs": 2,
}


def _two_machines(settings: dict[str, object], timeout: float) -> list[str]:
    """Machine 0 and machine 1 on localhost, as pets-launch starts them; their outputs."""
    port = free_port()
    procs = []
    for machine in (0, 1):
        cmd = [
            str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "2",
            "--machine_rank", str(machine), "--main_process_ip", "127.0.0.1",
            "--main_process_port", str(port), "--mixed_precision", "no", "--dynamo_backend", "no",
            str(HERE / "checkpoint_probe.py"), json.dumps(settings),
        ]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env={**os.environ, "PETS_ATTEMPT": "0"}, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))  # fmt: skip
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=timeout)[0])
        finally:
            proc.kill()
    for machine, (proc, output) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0, f"machine {machine}:\n{output[-5000:]}"
    return outputs


def _lines(output: str, kind: str) -> list[list[str]]:
    return [line.split()[1:] for line in output.splitlines() if line.startswith(kind + " ")]


@pytest.mark.timeout(400)
def test_machines_sharing_a_directory_write_one_checkpoint_with_every_ranks_random_states(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "checkpoints"
    settings = {**SETTINGS, "output_dir": str(tmp_path), "max_epochs_this_run": 1}
    first = _two_machines(settings, timeout=180)
    assert f"checkpoints: {directory} is shared by every machine" in first[0]

    # one copy: rank 0 wrote the model, optimizer and scheduler; rank 1 only its own random states
    writes = {rank: sorted(name for r, name in _lines(first[machine], "WRITE") if r == rank)
              for machine, rank in ((0, "0"), (1, "1"))}  # fmt: skip
    assert writes["0"] == ["model.safetensors", "optimizer.bin", "random_states_0.pkl", "scheduler.bin"]
    assert writes["1"] == ["random_states_1.pkl"]
    # rank 0 alone renamed it into place; nothing else is left in the directory
    renames = _lines(first[0], "RENAME") + _lines(first[1], "RENAME")
    assert [(r, to) for r, _, to in renames] == [("0", "epoch_1")]
    assert sorted(p.name for p in directory.iterdir()) == ["attempt", "epoch_1"]  # no temp, no probe
    assert not any(p.name.startswith(SHARE_PROBE) for p in directory.iterdir())
    assert sorted(p.name for p in (directory / "epoch_1").iterdir()) == [
        "model.safetensors", "optimizer.bin", "random_states_0.pkl", "random_states_1.pkl",
        "scheduler.bin", "trainer_state.json",
    ]  # fmt: skip

    # the resume gives each rank the state it saved, which differs between the ranks
    second = _two_machines({**settings, "max_epochs_this_run": None, "resume": True}, timeout=180)
    assert "resume: continuing after epoch 1" in second[0]
    saved = {r: d for r, what, d in _lines(first[0], "RNG") + _lines(first[1], "RNG") if what == "saved"}
    loaded = {r: d for r, what, d in _lines(second[0], "RNG") + _lines(second[1], "RNG") if what == "loaded"}
    assert saved["0"] != saved["1"]
    assert loaded == saved
    assert sorted(p.name for p in directory.iterdir()) == ["attempt", "epoch_1", "epoch_2"]
    assert (tmp_path / "summary.json").is_file()
