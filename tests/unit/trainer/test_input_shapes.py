"""The model sees one input shape for the whole run (issue 55, section 3): on a GPU under cudnn.benchmark
each new shape costs a cuDNN search (0.7-1.6 s on an H200). An epoch's short last batch and the eval
batches are padded to the training batch and masked; a real run records what reaches the first
convolution."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pets_training.synthetic import write_synthetic

pytestmark = pytest.mark.unit

RUNNER = """
import json, sys
import torch
from pets_training import train

shapes = set()
create = train.create_model

def recording(*args, **kwargs):  # the model, its first convolution recording the shapes it is given
    model = create(*args, **kwargs)
    first = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    first.register_forward_pre_hook(lambda module, inputs: shapes.add(tuple(inputs[0].shape)))
    return model

train.create_model = recording
summary = train.training_function(json.loads(sys.argv[1]))
print("SHAPES " + json.dumps(sorted(shapes)))
print("SUMMARY " + json.dumps(summary))
"""

# 46 images: 36 for training, in batches of 8 (the last of 4), and 10 for evaluation (one batch of 10
# before, at eval_batch_size 16)
SETTINGS: dict[str, object] = {
    "model": "resnet10t",
    "image_size": 32,
    "synthetic_classes": 2,
    "synthetic_images_per_class": 23,
    "epochs": 2,
    "batch_size": 8,
    "eval_batch_size": 16,
    "num_workers": 0,
    "threads": 1,
    "mixed_precision": "no",
    "pretrained": False,
    "checkpoints": False,
}


def _shapes(tmp_path: Path, **settings: object) -> tuple[list[list[int]], dict[str, object]]:
    config = {**SETTINGS, "output_dir": str(tmp_path / "out"), **settings}
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(config)], capture_output=True, text=True,
                          timeout=170)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines()
                 if line.startswith(("SHAPES ", "SUMMARY ")))
    return json.loads(lines["SHAPES"]), json.loads(lines["SUMMARY"])


@pytest.mark.timeout(180)
def test_the_model_sees_one_input_shape_on_the_cpu_path(tmp_path: Path) -> None:
    shapes, summary = _shapes(tmp_path)
    assert shapes == [[8, 3, 32, 32]]
    assert summary["status"] == "succeeded"


@pytest.mark.timeout(180)
def test_the_model_sees_one_input_shape_on_the_device_path_from_the_store(tmp_path: Path) -> None:
    """Files of two sizes, read from the decoded store and cropped on the device, a batch at once."""
    images = tmp_path / "images"
    write_synthetic(images, 2, 15, 40, seed=1)
    write_synthetic(tmp_path / "big", 2, 8, 57, seed=2)
    for path in (tmp_path / "big").iterdir():
        label, n = path.stem.rsplit("_", 1)
        path.rename(images / f"{label}_{100 + int(n)}.jpg")
    shapes, summary = _shapes(tmp_path, data=str(images), input_path="device",
                              input_store=str(tmp_path / "store"))
    assert shapes == [[8, 3, 32, 32]]
    assert summary["status"] == "succeeded"
