"""The input pipeline: where the DataLoader workers come from, the training loader, and the eval store.

Workers fork from a forkserver that has imported torch, torchvision and the datasets' modules once
(``start_worker_server``, in workers.py with all else a worker unpickles: this module imports accelerate,
and no worker imports it), started before the process has any thread of gloo or the metrics server: a
fork of the training process itself could copy a lock one of those threads holds (a rank's worker once
hung that way for good, 2026-11-24), and a forkserver without the preload makes every worker import
torch again (about 3 s of CPU each).

Training batches come from the CPU path (workers decode and crop) or the device path (device_input.py:
workers read files, the device decodes and crops), per ``--input-path``. Evaluation reads an
:class:`EvalStore`: this process's shard of the eval set, decoded and resized once
(the eval transform is deterministic) into uint8 batches of the training batch's shape, the last one
padded and masked: the model sees one input shape for the whole run (:func:`pad_batch` fills the
epoch's short last training batch). Every later evaluation is its forward passes alone, with no loader
or worker started.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate.utils import send_to_device
from torch.utils.data import DataLoader, Subset

from .data import EpochShuffleSampler, PetsData, PetsImages, build_data
from .device_input import choose_input_path, device_train_loader
from .store import use_store
from .workers import start_worker_server as start_worker_server  # re-exported: train.py imports it here
from .workers import worker_options as worker_options

if TYPE_CHECKING:
    from accelerate import Accelerator
    from torch import nn

    from .config import TrainConfig

log = logging.getLogger(__name__)

Batch = tuple[torch.Tensor, torch.Tensor]
PAD_LABEL = -100  # F.cross_entropy's ignore_index: a padded sample adds nothing to the loss or gradient


def local_data(cfg: TrainConfig, accelerator: Accelerator, output_dir: Path) -> PetsData:
    """The data set. The local main process checks the files the index of checks (beside the input store,
    else in the output directory) lacks and builds the input store; the other local ranks then read what
    it wrote, opening no file to check it and decoding nothing."""
    def build() -> PetsData:
        return build_data(cfg.data, cfg.image_size, cfg.seed, cfg.train_fraction, cfg.synthetic_classes,
                          cfg.synthetic_images_per_class, cfg.fast_decode, cfg.data_layout,
                          check_index_dir=Path(cfg.input_store) if cfg.input_store else output_dir,
                          write_check_index=accelerator.is_local_main_process)

    data = build() if accelerator.is_local_main_process else None
    if data is not None:
        log.info("data %s; %d for training, %d for evaluation", data.source, len(data.train), len(data.eval))
        if cfg.input_store:
            log.info("%s", use_store(data, cfg.input_store, cfg.fast_decode))
    accelerator.wait_for_everyone()
    if data is None:
        data = build()
        if cfg.input_store:
            use_store(data, cfg.input_store, cfg.fast_decode, build=False)
    return data


def train_loader(
    data: PetsData, cfg: TrainConfig, workers: int, device: torch.device
) -> tuple[DataLoader, EpochShuffleSampler, Callable[[Any], Batch]]:
    """The training loader (persistent workers), its sampler, whose keys carry the epoch, and what makes a
    batch of it (uint8 crops, labels) on the device: nothing on the CPU path, decode and crop on the
    device path (``--input-path``, device_input.py)."""
    path, line = choose_input_path(cfg.input_path, data.train, device)
    log.info("%s", line)
    options = worker_options(workers, device.type == "cuda")
    if path == "device":
        return device_train_loader(data.train, cfg, options, device)
    sampler = EpochShuffleSampler(len(data.train), cfg.seed)
    loader = DataLoader(data.train, batch_size=cfg.batch_size, sampler=sampler,
                        persistent_workers=workers > 0, **options)
    # a CPU-path batch (uint8 crops, labels) onto the device: the training loader is not accelerate's
    return loader, sampler, functools.partial(send_to_device, device=device, non_blocking=True)


def eval_shard(n: int, rank: int, world: int, batch_size: int) -> tuple[list[int], int, int]:
    """This process's eval indices (every ``world``-th from ``rank``: the shards are disjoint and cover
    the set), the batch size every process uses (``batch_size``, the training batch's: one input shape
    for the model) and the number of batches every process runs: the same on all, so collectives line
    up; the padding is under one batch."""
    return list(range(rank, n, world)), batch_size, math.ceil(math.ceil(n / world) / batch_size)


@dataclass
class EvalStore:
    """This process's eval shard as uint8 NCHW batches of one shape on the device, with labels and a
    mask of the real samples (the padding of the last batches is False)."""

    images: list[torch.Tensor]
    labels: list[torch.Tensor]
    valid: list[torch.Tensor]
    samples: int  # the real ones

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        return iter(zip(self.images, self.labels, self.valid, strict=True))

    def __len__(self) -> int:
        return len(self.images)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.images)


class EvalStoreBuild:
    """The decoding of this process's eval shard into an :class:`EvalStore`: ``start`` sets its workers
    (forkserver workers, gone when done) decoding the whole shard ahead, beside training; ``collect``
    waits for what is left (all of it, here, without ``start`` or workers)."""

    def __init__(
        self, dataset: PetsImages, batch_size: int, rank: int, world: int, workers: int, device: torch.device
    ):
        self.indices, self.batch, self.batches = eval_shard(len(dataset), rank, world, batch_size)
        workers = min(workers, self.batches)
        options = worker_options(workers, device.type == "cuda")
        if workers:  # every batch asked for at once: the workers decode the shard without waiting for us
            options["prefetch_factor"] = math.ceil(self.batches / workers) + 1
        self.loader = DataLoader(Subset(dataset, self.indices), batch_size=self.batch, **options)
        self.device = device
        self.running: Iterator[Any] | None = None

    def start(self) -> None:
        if self.running is None and self.loader.num_workers:
            self.running = iter(self.loader)

    def collect(self) -> EvalStore:
        batch = self.batch
        images: list[torch.Tensor] = []
        labels: list[torch.Tensor] = []
        valid: list[torch.Tensor] = []
        for chunk, chunk_labels in self.running or self.loader:
            images.append(_pad(chunk, batch))
            labels.append(_pad(chunk_labels, batch))
            valid.append(torch.arange(batch) < chunk.shape[0])
        self.running = None
        while len(images) < self.batches:  # a short shard: masked batches, so every process runs as many
            images.append(torch.zeros_like(images[0]))  # check_fits_world: every shard has a sample
            labels.append(torch.zeros(batch, dtype=torch.long))
            valid.append(torch.zeros(batch, dtype=torch.bool))
        images, labels, valid = send_to_device((images, labels, valid), self.device, non_blocking=True)
        return EvalStore(images, labels, valid, len(self.indices))


def build_eval_store(
    dataset: PetsImages, batch_size: int, rank: int, world: int, workers: int, device: torch.device
) -> EvalStore:
    """Decode and resize this process's eval shard once (in ``workers`` forkserver workers; 0: here) into
    an :class:`EvalStore` on ``device``."""
    return EvalStoreBuild(dataset, batch_size, rank, world, workers, device).collect()


def _pad(t: torch.Tensor, size: int) -> torch.Tensor:
    if t.shape[0] == size:
        return t
    return torch.cat([t, t.new_zeros((size - t.shape[0], *t.shape[1:]))])


def pad_batch(images: torch.Tensor, labels: torch.Tensor, size: int) -> Batch:
    """A short training batch (an epoch's last) filled up to ``size`` with repeats of its own images,
    labelled PAD_LABEL: the model keeps one input shape (on a GPU each new one costs a cuDNN search);
    the repeats add nothing to the loss or the gradient, and keep BatchNorm's batch statistics near those
    of the real samples."""
    n = labels.shape[0]
    if n >= size:
        return images, labels
    fill = torch.arange(size - n, device=images.device) % n
    return torch.cat([images, images[fill]]), torch.cat([labels, labels.new_full((size - n,), PAD_LABEL)])


def evaluate(
    model: nn.Module,
    store: EvalStore,
    accelerator: Accelerator,
    normalise: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[int, int]:
    """(correct, counted) over the eval set, across all processes. Each sample is in one shard and the
    padding is masked, so the sum over processes counts every sample once (as ``gather_for_metrics`` did),
    with one collective per pass and no host sync per batch."""
    model.eval()
    totals = torch.zeros(2, dtype=torch.long, device=accelerator.device)
    with torch.no_grad():
        for images, labels, valid in store:
            hits = (model(normalise(images)).argmax(dim=-1) == labels) & valid
            totals += torch.stack([hits.sum(), valid.sum()])
    summed = accelerator.reduce(totals, "sum")
    return int(summed[0].item()), int(summed[1].item())
