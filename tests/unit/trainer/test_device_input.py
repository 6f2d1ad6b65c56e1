"""The device input path (``pets_training.device_input``): the workers read the files, the batch is decoded
and cropped where the model runs. Run here on the CPU tensor backend, where its crops are the CPU path's
boxes resized by one batched operation: within helpers.CROP_MAX_LEVELS (2) of the CPU path's torchvision
resize, CROP_MEAN_LEVELS (0.05) on average; on a GPU nvJPEG's decode differs by about 1.3-1.5 levels of
255 on average (docs/gpu.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from accelerate.data_loader import skip_first_batches

from pets_training.data import PetsData, build_data
from pets_training.device_input import (
    DeviceCrops,
    EncodedImages,
    choose_input_path,
    collate_encoded,
    device_train_loader,
    gpu_decoder_missing,
)
from pets_training.inputs import start_worker_server, worker_options

from .helpers import (
    DEVICE_PATH_PROGRESS,
    assert_crops_close,
    assert_device_path_gives_the_cpu_paths_crops,
    assert_same_progress,
    train_variants,
    write_mixed_set,
)

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> PetsData:
    return build_data(str(write_mixed_set(tmp_path_factory.mktemp("mixed"))), 32, 42, 0.8, 0, 0)


def _cpu_batches(data: PetsData, keys: list[int]) -> torch.Tensor:
    return torch.stack([data.train[key][0] for key in keys])


def test_device_path_crops_are_the_cpu_paths_within_the_tolerance(data: PetsData) -> None:
    """Images of several sizes (48 and 71 px, a PNG, a grayscale and a CMYK JPEG) in one batch."""
    assert_device_path_gives_the_cpu_paths_crops(data, CPU)


def test_images_the_batched_decode_refuses_are_decoded_one_by_one_then_on_the_cpu(
    data: PetsData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nvJPEG refuses some JPEGs (CMYK): the batch is decoded one by one, and what still fails goes to the
    CPU path's decoder; the crops do not change."""
    from pets_training import device_input

    paths = data.train.files()
    assert paths is not None
    encoded = EncodedImages(paths, data.train.labels)
    keys = list(range(len(data.train)))
    expected = _cpu_batches(data, keys)
    real = device_input.decode_jpeg
    refused = {"lists": 0, "single": 0}

    def picky(images: object, **kwargs: object) -> object:
        if isinstance(images, list):  # the batched call fails
            refused["lists"] += 1
            raise RuntimeError("nvjpeg: unsupported")
        if refused["single"] < 3:  # and the first three one by one
            refused["single"] += 1
            raise RuntimeError("nvjpeg: unsupported")
        return real(images, **kwargs)  # type: ignore[arg-type]

    batch = collate_encoded([encoded[k] for k in keys])
    unrefused, _ = DeviceCrops(data.train, paths, CPU)(batch)
    monkeypatch.setattr(device_input, "decode_jpeg", picky)
    images, _ = DeviceCrops(data.train, paths, CPU)(batch)
    assert torch.equal(images, unrefused) and refused == {"lists": 1, "single": 3}
    assert_crops_close(images, expected)


def _epoch(data: PetsData, workers: int, epoch: int, skip: int = 0) -> list[torch.Tensor]:
    loader, sampler, crops = device_train_loader(data.train, _cfg(), worker_options(workers, False), CPU)
    sampler.set_epoch(epoch)
    batches = skip_first_batches(loader, skip) if skip else loader
    return [crops(batch)[0] for batch in batches]


def _cfg() -> object:
    from pets_training.config import resolve

    return resolve(overrides={"batch_size": 5, "seed": 42})


def test_crops_are_the_same_with_0_1_and_4_workers_and_after_a_resume(data: PetsData) -> None:
    start_worker_server()
    alone = _epoch(data, 0, 2)
    assert len(alone) == 6  # 26 training images (of 33) in batches of 5
    for workers in (1, 4):
        assert all(torch.equal(a, b) for a, b in zip(alone, _epoch(data, workers, 2), strict=True))
    resumed = _epoch(data, 1, 2, skip=2)  # a resume at step 2 of the epoch (skip_first_batches)
    assert all(torch.equal(a, b) for a, b in zip(alone[2:], resumed, strict=True))
    assert not torch.equal(alone[0], _epoch(data, 0, 3)[0])  # another epoch: other crops


@pytest.mark.parametrize("decoder", ["works", "fails"])
def test_auto_takes_the_gpu_decoder_where_it_works_and_else_the_cpu_with_one_line(
    data: PetsData, decoder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both sides of the nvJPEG probe on any machine: torchvision's decoder forced to work or to fail."""
    from pets_training import device_input

    def decode(jpegs: list[torch.Tensor], mode: object, device: torch.device) -> list[torch.Tensor]:
        if decoder == "fails":
            raise RuntimeError("Not compiled with GPU support")
        return [torch.zeros(3, 8, 8, dtype=torch.uint8, device="meta") for _ in jpegs]

    monkeypatch.setattr(device_input, "decode_jpeg", decode)
    gpu = torch.device("cuda")
    if decoder == "works":
        assert gpu_decoder_missing(gpu) == ""
        assert choose_input_path("auto", data.train, gpu) == (
            "device", "input path device: workers read the files, nvJPEG decodes and crops on cuda")
    else:
        assert gpu_decoder_missing(gpu) == (
            "torchvision's GPU JPEG decoder failed (RuntimeError: Not compiled with GPU support)")
        path, line = choose_input_path("auto", data.train, gpu)
        assert path == "cpu" and "no GPU JPEG decoder (torchvision's GPU JPEG decoder failed" in line
    # no GPU at all: the decoder is not even tried
    path, line = choose_input_path("auto", data.train, CPU)
    assert path == "cpu" and "no GPU JPEG decoder (the device is cpu, not a GPU)" in line
    assert choose_input_path("device", data.train, CPU)[0] == "device"
    assert choose_input_path("cpu", data.train, CPU)[0] == "cpu"
    synthetic = build_data("synthetic", 32, 42, 0.8, 3, 10)
    assert choose_input_path("device", synthetic.train, CPU) == (
        "cpu", "input path cpu: the synthetic set is generated on the CPU")
    with pytest.raises(ValueError, match="input_path must be one of auto, cpu, device"):
        choose_input_path("gpu", data.train, CPU)


@pytest.mark.timeout(300)
def test_the_trainer_learns_the_same_on_both_paths(tmp_path: Path) -> None:
    """Crops within the tolerance, same model init: epoch for epoch about the same loss and accuracy, on the
    CPU backend."""
    logs = train_variants(tmp_path, {path: ["--input-path", path] for path in ("cpu", "device")})
    assert "input path device (asked): workers read the files, decode and crop on cpu" in logs["device"]
    assert_same_progress(tmp_path / "cpu", tmp_path / "device", **DEVICE_PATH_PROGRESS)
