"""The device input path (``--input-path device``): the DataLoader workers only read each training image's
file; the training process decodes the whole batch on its device in one call (nvJPEG through
``torchvision.io.decode_jpeg(..., device="cuda")`` on a GPU) and crops each image there with the CPU
path's own transform under the CPU path's seed (``PetsImages.crop``): the same box for (seed, epoch,
index), whatever the workers or a resume. On the CPU tensor backend its crops equal the CPU path's
exactly; on a GPU, nvJPEG's decode differs from libjpeg-turbo's by about 1.3-1.5 levels of 255 on average
(docs/gpu.md), and so do the crops.

Files that are not JPEGs (PNG) are decoded in the worker, as on the CPU path; when nvJPEG refuses a JPEG
of the batch (CMYK), the batch is decoded one by one and what it still refuses is decoded on the CPU.
``auto`` takes this path where a GPU decoder works, and says in one line why not where it does not.
With the decoded store (``--input-store``) there is nothing to decode: no workers at all, the loader
yields sampler keys, and each image is read once and kept on the device (``StoreCrops``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.io import ImageReadMode, decode_jpeg

from .data import EpochShuffleSampler, PetsImages, load_file_fast, load_file_pil
from .store import StoreLoader

if TYPE_CHECKING:
    from .config import TrainConfig

log = logging.getLogger(__name__)

INPUT_PATHS = ("auto", "cpu", "device")
JPEG_MAGIC = b"\xff\xd8"


@dataclass
class EncodedBatch:
    """A training batch as the workers send it: per image its JPEG bytes (``encoded``) or its decoded
    uint8 CHW tensor, and its sampler key. It has no ``.to``: accelerate hands it over as it is."""

    payloads: list[torch.Tensor]
    encoded: list[bool]
    keys: list[int]  # epoch * len(set) + index
    labels: torch.Tensor


class EncodedImages(Dataset[tuple[torch.Tensor, bool, int, int]]):
    """The training set's files, read as they are (a JPEG's bytes; anything else decoded here)."""

    def __init__(self, paths: list[Path], labels: list[int]):
        self.paths = paths
        self.labels = labels

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, key: int) -> tuple[torch.Tensor, bool, int, int]:
        index = int(key) % len(self.paths)
        raw = self.paths[index].read_bytes()
        if raw[:2] == JPEG_MAGIC:
            return torch.frombuffer(bytearray(raw), dtype=torch.uint8), True, int(key), self.labels[index]
        return load_file_pil(self.paths[index]), False, int(key), self.labels[index]


def collate_encoded(samples: list[tuple[torch.Tensor, bool, int, int]]) -> EncodedBatch:
    payloads, encoded, keys, labels = zip(*samples, strict=True)
    return EncodedBatch(list(payloads), list(encoded), list(keys), torch.tensor(labels, dtype=torch.long))


class DeviceCrops:
    """EncodedBatch -> (uint8 NCHW crops, labels) on ``device``: one batched decode, then each image's
    crop by ``images.crop`` (the CPU path's transform and seed)."""

    def __init__(self, images: PetsImages, paths: list[Path], device: torch.device):
        self.images = images
        self.paths = paths
        self.device = device

    def decode(self, batch: EncodedBatch) -> list[torch.Tensor]:
        out = list(batch.payloads)
        jpegs = [i for i, encoded in enumerate(batch.encoded) if encoded]
        if jpegs:
            try:
                decoded = decode_jpeg([out[i] for i in jpegs], mode=ImageReadMode.RGB, device=self.device)
            except RuntimeError:  # one the decoder refuses (CMYK on nvJPEG...): one by one, it on the CPU
                decoded = [self.decode_one(out[i], batch.keys[i]) for i in jpegs]
            for i, image in zip(jpegs, decoded, strict=True):
                out[i] = image
        return [image.to(self.device, non_blocking=True) for image in out]

    def decode_one(self, data: torch.Tensor, key: int) -> torch.Tensor:
        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:  # the CPU path's decode: libjpeg-turbo, else PIL, else CorruptImageError
            return load_file_fast(self.paths[key % len(self.paths)])

    def __call__(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self.paths)
        crops = [self.images.crop(image, *divmod(key, n))
                 for image, key in zip(self.decode(batch), batch.keys, strict=True)]
        return torch.stack(crops), batch.labels.to(self.device, non_blocking=True)


class Keys(Dataset[int]):
    """The sampler's keys as they are, batched into a tensor: the images are read where they are cropped."""

    def __getitem__(self, key: int) -> int:
        return int(key)


class StoreCrops:
    """A batch of sampler keys -> (uint8 crops, labels) on ``device`` from the decoded store, with no
    workers: each image is read here the first time and kept on the device (on a CPU the store's memory map
    is the only copy)."""

    def __init__(self, images: PetsImages, device: torch.device):
        self.images = images
        self.device = device
        self.kept: dict[int, torch.Tensor] = {}

    def image(self, index: int) -> torch.Tensor:
        if self.device.type == "cpu":
            return self.images.load(index)
        if index not in self.kept:
            self.kept[index] = self.images.load(index).to(self.device, non_blocking=True)
        return self.kept[index]

    def __call__(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        n, keys = len(self.images), batch.tolist()
        crops = [self.images.crop(self.image(key % n), *divmod(key, n)) for key in keys]
        labels = torch.tensor([self.images.labels[key % n] for key in keys])
        return torch.stack(crops), labels.to(self.device, non_blocking=True)


def gpu_decoder_missing(device: torch.device) -> str:
    """Why ``device`` cannot decode JPEGs ("" when it can): no GPU, or nvJPEG failing on a tiny JPEG."""
    if device.type != "cuda":
        return f"the device is {device.type}, not a GPU"
    try:
        from torchvision.io import encode_jpeg

        jpeg = encode_jpeg(torch.zeros(3, 8, 8, dtype=torch.uint8))
        decode_jpeg([jpeg], mode=ImageReadMode.RGB, device=device)
    except (RuntimeError, TypeError) as err:
        return f"torchvision's GPU JPEG decoder failed ({type(err).__name__}: {err})"
    return ""


def choose_input_path(requested: str, images: PetsImages, device: torch.device) -> tuple[str, str]:
    """("cpu" or "device", the one log line that says why). ``device`` runs on any device (on the CPU:
    decoding in this process); ``auto`` takes it only where a GPU decoder works."""
    if requested not in INPUT_PATHS:
        raise ValueError(f"input_path must be one of {', '.join(INPUT_PATHS)}, got {requested!r}")
    if requested == "cpu":
        return "cpu", "input path cpu (asked): decode and crop on the CPU"
    if images.files() is None:
        return "cpu", "input path cpu: the synthetic set is generated on the CPU"
    if requested == "device":
        return "device", f"input path device (asked): workers read the files, decode and crop on {device}"
    if missing := gpu_decoder_missing(device):
        return "cpu", f"input path cpu: no GPU JPEG decoder ({missing}); decode and crop on the CPU"
    return "device", f"input path device: workers read the files, nvJPEG decodes and crops on {device}"


def device_train_loader(
    images: PetsImages, cfg: TrainConfig, options: dict[str, Any], device: torch.device
) -> tuple[DataLoader, EpochShuffleSampler, DeviceCrops | StoreCrops]:
    """The device path's training loader (its sampler the CPU path's) and what finishes its batches. From
    the decoded store (--input-store) it has no workers: the loader yields keys, the images stay on the
    device."""
    paths = images.files()
    if paths is None:
        raise ValueError("the device input path reads image files; the synthetic set has none")
    sampler = EpochShuffleSampler(len(images), cfg.seed)
    if isinstance(getattr(images.load, "load_all", None), StoreLoader):
        log.info("input store on the device path: no DataLoader workers; each training image is read once "
                 "and kept on %s", device)
        keys = DataLoader(Keys(), batch_size=cfg.batch_size, sampler=sampler)
        return keys, sampler, StoreCrops(images, device)
    loader = DataLoader(EncodedImages(paths, images.labels), batch_size=cfg.batch_size, sampler=sampler,
                        collate_fn=collate_encoded, persistent_workers=options["num_workers"] > 0, **options)
    return loader, sampler, DeviceCrops(images, paths, device)
