"""No device-to-host read inside a training step except on the steps that log (issue 55, section 2).

A read (``.item()``, ``float(t)``, ``bool(t)``, ``.tolist()``) is ``aten._local_scalar_dense`` in the
dispatcher; on a GPU it waits for the whole step, so the host cannot prepare the next batch meanwhile. A
real run counts them per step under a ``TorchDispatchMode``. On a CPU fp16's GradScaler cannot run (no
fp16 autocast there): its path, a fused Adam that takes the inf check, is covered by test_precision.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

RUNNER = """
import json, sys
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from pets_training.train import training_function

class CountReads(TorchDispatchMode):
    reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            CountReads.reads += 1
        return func(*args, **(kwargs or {}))

per_step, last = {}, [0]

def hook(step, images):  # after each optimizer step: the reads since the one before
    per_step[step] = CountReads.reads - last[0]
    last[0] = CountReads.reads

with CountReads():
    training_function(json.loads(sys.argv[1]), step_hook=hook)
print("READS " + json.dumps(per_step))
"""

STEPS = 6
SETTINGS: dict[str, object] = {
    "model": "resnet10t",
    "image_size": 32,
    "synthetic_classes": 2,
    "synthetic_images_per_class": 20,  # 32 for training: 8 steps of 4, of which STEPS run
    "epochs": 1,
    "max_train_steps": STEPS,
    "batch_size": 4,
    "eval_batch_size": 8,
    "num_workers": 1,  # the crops in a worker, as on a GPU; the device input path is test_device_input.py's
    "threads": 1,
    "pretrained": False,
    "checkpoints": False,
}


def _reads(tmp_path: object, **settings: object) -> dict[int, int]:
    config = {**SETTINGS, "output_dir": str(tmp_path), **settings}
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(config)], capture_output=True, text=True,
                          timeout=170)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("READS ")]
    return {int(step): count for step, count in json.loads(line.removeprefix("READS ")).items()}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_no_step_reads_back_outside_the_logging_steps(tmp_path: object, precision: str) -> None:
    """Step 1 holds the start (setup, the first batch); every later step must read nothing back."""
    reads = _reads(tmp_path, mixed_precision=precision, log_every=10_000.0)
    assert sorted(reads) == list(range(1, STEPS + 1))
    assert {step: n for step, n in reads.items() if step > 1 and n} == {}


@pytest.mark.timeout(180)
def test_a_logging_step_reads_its_loss_so_the_count_sees_reads_inside_a_step(tmp_path: object) -> None:
    reads = _reads(tmp_path, mixed_precision="no", log_every=1e-9)  # a log line (its loss) every step
    assert all(reads[step] >= 1 for step in range(2, STEPS + 1)), reads
