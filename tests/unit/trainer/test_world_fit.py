"""A data set too small for the world size is a configuration error the trainer sees at start (exit 78
with the numbers), not a training that "succeeds" with an accuracy nobody measured (issue 21)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pets_training.data import DataError, check_fits_world, smallest_set_for_world, split_indices

from .helpers import free_port

pytestmark = pytest.mark.unit


def test_a_set_that_gives_every_process_a_batch_and_an_eval_image_passes() -> None:
    check_fits_world(n_train=17, n_eval=4, world_size=4, batch_size=4, train_fraction=0.8, where="x")
    check_fits_world(n_train=1, n_eval=1, world_size=1, batch_size=64, train_fraction=0.8, where="x")


def test_the_issues_case_two_classes_of_two_images_on_four_processes_is_refused_with_the_numbers() -> None:
    with pytest.raises(DataError) as err:
        check_fits_world(n_train=3, n_eval=1, world_size=4, batch_size=32, train_fraction=0.8,
                         where="synthetic: 2 classes x 2 images")
    text = str(err.value)
    for part in ("4 images", "3 for training", "1 for evaluation", "4 processes", "batch_size 32",
                 "at least 97 training images", "4 evaluation images",
                 f"smallest set that works has {smallest_set_for_world(4, 32, 0.8)} images"):
        assert part in text, part


@pytest.mark.parametrize("n_train, n_eval", [(8, 1), (4, 4), (0, 5)])
def test_too_few_eval_images_or_training_batches_for_two_processes_are_refused(n_train: int,
                                                                               n_eval: int) -> None:
    with pytest.raises(DataError):
        check_fits_world(n_train=n_train, n_eval=n_eval, world_size=2, batch_size=4, train_fraction=0.8,
                         where="x")


@pytest.mark.parametrize("world, batch, fraction", [(1, 64, 0.8), (2, 16, 0.8), (4, 32, 0.8), (3, 5, 0.5),
                                                     (8, 1, 0.9)])
def test_the_smallest_set_is_the_smallest_whose_real_split_fits(world: int, batch: int,
                                                                fraction: float) -> None:
    n = smallest_set_for_world(world, batch, fraction)
    train, evals = split_indices(n, 0, fraction)
    check_fits_world(len(train), len(evals), world, batch, fraction, "x")
    smaller_train, smaller_eval = split_indices(n - 1, 0, fraction)
    with pytest.raises(DataError):
        check_fits_world(len(smaller_train), len(smaller_eval), world, batch, fraction, "x")


def test_two_real_processes_on_a_tiny_set_exit_78_before_training(tmp_path: Path) -> None:
    """A real 2-process `accelerate launch`: 2 classes x 2 images give an evaluation split of 1 image."""
    summary = tmp_path / "summary.json"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--main_process_port", str(free_port()), "--mixed_precision", "no",
           "--dynamo_backend", "no", "-m", "pets_training",
           "--data", "synthetic", "--synthetic-classes", "2", "--synthetic-images-per-class", "2",
           "--model", "resnet18", "--image-size", "32", "--batch-size", "4", "--no-pretrained",
           "--epochs", "1", "--output-dir", str(tmp_path / "out"), "--summary-path", str(summary)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert "2 processes with batch_size 4" in proc.stderr, proc.stderr[-3000:]
    assert "1 for evaluation" in proc.stderr
    assert not (tmp_path / "out" / "model.safetensors").exists()
    assert json.loads(summary.read_text())["status"] == "failed"
