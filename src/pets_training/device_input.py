"""The device input path (``--input-path device``): the DataLoader workers only read each training image's
file; the training process decodes the whole batch on its device in one call (nvJPEG through
``torchvision.io.decode_jpeg(..., device="cuda")`` on a GPU) and crops the whole batch there at once
(crops.py): the CPU path's boxes, a function of (seed, epoch, index) whatever the workers or a resume,
resized together by a number of operations that does not grow with the batch. On the CPU tensor backend
its crops are within 2 levels of 255 of the CPU path's (about 0.02 on average); on a GPU, nvJPEG's decode
differs from libjpeg-turbo's by about 1.3-1.5 levels of 255 on average (docs/gpu.md), and so do the crops.

Files that are not JPEGs (PNG) are decoded in the worker, as on the CPU path; when nvJPEG refuses a JPEG
of the batch (CMYK), the batch is decoded one by one and what it still refuses is decoded on the CPU.
``auto`` takes this path where a GPU decoder works, and says in one line why not where it does not.
With the decoded store (``--input-store``) there is nothing to decode: no workers at all, the loader
yields sampler keys, and each image is read once and kept on the device, the training set in one buffer
(``StoreCrops``; on a CPU too, in memory).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.io import ImageReadMode, decode_jpeg

from .crops import crop_boxes, resize_boxes
from .data import EpochShuffleSampler, PetsImages, _Subset, load_file_fast, load_file_pil
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


def batch_boxes(images: PetsImages, keys: torch.Tensor, heights: torch.Tensor,
                widths: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
    """The crop boxes of the sampler keys ``keys`` in images of ``heights`` x ``widths`` (CPU tensors), and
    the largest box's height and width."""
    epoch, index = keys // len(images), keys % len(images)
    boxes = crop_boxes(images.seed, epoch, index, heights, widths)
    box_h, box_w = boxes[:, 2:].amax(dim=0).tolist()
    return boxes, (box_h, box_w)


class DeviceCrops:
    """EncodedBatch -> (uint8 NCHW crops, labels) on ``device``: one batched decode, the images laid one
    after the other in one buffer (one copy), then every box of the batch resized at once
    (:func:`.crops.resize_boxes`), whatever the batch size and the images' sizes."""

    def __init__(self, images: PetsImages, paths: list[Path], device: torch.device):
        self.images = images
        self.paths = paths
        self.device = device
        self.tail = torch.zeros(0, dtype=torch.uint8, device=device)  # room for a box's last row past the end

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
        return [image.to(self.device, non_blocking=True) for image in out]  # those decoded elsewhere

    def decode_one(self, data: torch.Tensor, key: int) -> torch.Tensor:
        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:  # the CPU path's decode: libjpeg-turbo, else PIL, else CorruptImageError
            return load_file_fast(self.paths[key % len(self.paths)])

    def __call__(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        images = self.decode(batch)
        shapes = torch.tensor([image.shape for image in images])
        boxes, box_max = batch_boxes(self.images, torch.tensor(batch.keys), shapes[:, 1], shapes[:, 2])
        if self.tail.numel() < box_max[1]:
            self.tail = torch.zeros(2 * box_max[1], dtype=torch.uint8, device=self.device)
        # one copy of the batch, whatever its images' sizes (torch's op for FSDP2's flat buffers)
        flat = torch._chunk_cat([*images, self.tail], 0, 1)[0]
        sizes = shapes.prod(dim=1)
        layout = torch.stack([sizes.cumsum(0) - sizes, shapes[:, 1], shapes[:, 2]], dim=1)
        layout, boxes = torch.cat([layout, boxes], dim=1).to(self.device, non_blocking=True).split([3, 4], 1)
        crops = resize_boxes(flat, layout, boxes, self.images.size, box_max)
        return crops, batch.labels.to(self.device, non_blocking=True)


class Keys(Dataset[int]):
    """The sampler's keys as they are, batched into a tensor: the images are read where they are cropped."""

    def __getitem__(self, key: int) -> int:
        return int(key)


class StoreCrops:
    """A batch of sampler keys -> (uint8 crops, labels) on ``device`` from the decoded store, with no
    workers: the training images lie one after the other in one buffer on the device, each read from the
    store (its checksum checked) and copied there the first time a batch holds it; every box of a batch is
    then resized at once (:func:`.crops.resize_boxes`), whatever the batch size."""

    def __init__(self, images: PetsImages, device: torch.device):
        load = images.load
        assert isinstance(load, _Subset) and isinstance(load.load_all, StoreLoader)
        self.images = images
        self.device = device
        shapes = np.array([load.load_all.shapes[i] for i in load.indices], dtype=np.int64).reshape(-1, 3)
        sizes = shapes.prod(axis=1)
        offsets = np.cumsum(sizes) - sizes
        self.layout = torch.from_numpy(np.stack([offsets, shapes[:, 1], shapes[:, 2]], axis=1))
        self.labels = torch.tensor(images.labels)
        # the images, filled as batches first hold each, then room for a box's last row
        self.flat = torch.empty(int(sizes.sum() + shapes[:, 2].max()), dtype=torch.uint8, device=device)
        self.flat[int(sizes.sum()):] = 0
        self.kept = np.zeros(len(images), dtype=bool)

    def keep(self, indices: np.ndarray) -> None:
        """Read the images ``indices`` not yet kept (from the store, checksums checked) into the buffer."""
        for index in np.unique(indices[~self.kept[indices]]).tolist():  # each image once in the run
            offset = int(self.layout[index, 0])
            image = self.images.load(index)
            self.flat[offset:offset + image.numel()].copy_(image.view(-1), non_blocking=True)
            self.kept[index] = True

    def __call__(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        index = batch % len(self.images)
        self.keep(index.numpy())
        layout = self.layout[index]
        boxes, box_max = batch_boxes(self.images, batch, layout[:, 1], layout[:, 2])
        meta = torch.cat([layout, boxes, self.labels[index, None]], dim=1).to(self.device, non_blocking=True)
        layout, boxes, labels = meta.split([3, 4, 1], dim=1)
        return resize_boxes(self.flat, layout, boxes, self.images.size, box_max), labels[:, 0]


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
