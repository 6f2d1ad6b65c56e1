"""The device input path's branches that only a CUDA GPU takes (marker `gpu`; `make test` selects `unit` and
leaves them out). tests/gpu/run.sh runs them on a lent GPU machine: with pytest where the machine has it,
else as `python tests/gpu/test_gpu_paths.py`, which calls each test with a fresh directory.

- nvJPEG's decode and the batched crops on the GPU give the CPU path's crops within the tolerance the CPU
  backend of the same code is held to (tests/unit/trainer/helpers.py, assert_crops_close);
- from the input store, the training images are kept in one buffer in GPU memory, and cropped there as the
  CPU path crops them.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from pets_training.config import resolve
from pets_training.data import build_data
from pets_training.device_input import (
    StoreCrops,
    device_train_loader,
)
from pets_training.inputs import worker_options
from pets_training.store import use_store

pytestmark = pytest.mark.gpu

# cpu: the same code on the CPU backend, a try of these tests on a machine without a GPU (run.sh's dry run)
DEVICE = torch.device(os.environ.get("PETS_GPU_TESTS_DEVICE", "cuda"))


def assert_crops_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    from unit.trainer.helpers import assert_crops_close as close  # tests/ is on pytest's path (pyproject)

    close(got.cpu(), expected.cpu())


def _images(directory: Path) -> Path:
    """JPEGs of two sizes, a PNG, a grayscale and a CMYK JPEG (nvJPEG refuses the last two: the CPU's)."""
    from unit.trainer.helpers import write_mixed_set

    return write_mixed_set(directory)


def test_nvjpeg_and_the_gpu_crops_give_the_cpu_paths_crops(tmp_path: Path) -> None:
    from unit.trainer.helpers import assert_device_path_gives_the_cpu_paths_crops

    data = build_data(str(_images(tmp_path / "images")), 32, 42, 0.8, 0, 0)
    assert_device_path_gives_the_cpu_paths_crops(data, DEVICE)


def test_the_store_is_kept_in_gpu_memory_and_crops_as_the_cpu_path(tmp_path: Path) -> None:
    images = _images(tmp_path / "images")
    plain = build_data(str(images), 32, 42, 0.8, 0, 0)
    stored = build_data(str(images), 32, 42, 0.8, 0, 0)
    use_store(stored, str(tmp_path / "store"))
    cfg = resolve(overrides={"batch_size": 5, "seed": 42})
    loader, sampler, crops = device_train_loader(stored.train, cfg, worker_options(0, False), DEVICE)
    assert isinstance(crops, StoreCrops) and loader.num_workers == 0
    assert crops.flat.device.type == DEVICE.type
    sampler.set_epoch(2)
    keys = list(sampler)
    got = torch.cat([crops(batch)[0] for batch in loader])
    assert got.device.type == DEVICE.type
    assert bool(crops.kept.all()), "every training image kept after an epoch"
    assert_crops_close(got, torch.stack([plain.train[k][0] for k in keys]))


if __name__ == "__main__":  # the GPU machine may have no pytest: each test, a fresh directory, a line each
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    failed = 0
    for name, test in [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_")]:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                test(Path(tmp))
                print(f"PASSED {name}")
            except Exception as error:  # every test runs; the exit code says whether one failed
                failed += 1
                print(f"FAILED {name}: {type(error).__name__}: {error}")
    sys.exit(1 if failed else 0)
