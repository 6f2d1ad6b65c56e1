"""What one run of the trainer holds: what setup made (Training), what carries from epoch to epoch
(RunState), and the uint8-to-float step on the device (Normalise)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate import Accelerator
from torch import nn

from .data import EpochShuffleSampler, PetsData
from .inputs import Batch, EvalStore, EvalStoreBuild
from .position import Layout
from .progress import TimeSplit
from .stepsave import SaveClock

if TYPE_CHECKING:
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.scheduler import AcceleratedScheduler
    from torch.utils.data import DataLoader

    from .tracking import RunTrackers


class Normalise:
    """uint8 NCHW batch on the device -> float, /255 (ToTensor) and the model's mean/std, in one pass."""

    def __init__(self, model: nn.Module, device: torch.device, channels_last: bool):
        cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", {})
        mean = torch.tensor(cfg.get("mean", (0.485, 0.456, 0.406)), device=device)[None, :, None, None]
        std = torch.tensor(cfg.get("std", (0.229, 0.224, 0.225)), device=device)[None, :, None, None]
        self.scale = 1.0 / (255.0 * std)
        self.shift = mean / std
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        out = images.float() * self.scale - self.shift
        return out.contiguous(memory_format=self.memory_format)


@dataclass
class Training:
    """What setup made: the accelerator, what it prepared, and where the outputs go."""

    accelerator: Accelerator
    data: PetsData
    module: nn.Module
    normalise: Normalise
    optimizer: AcceleratedOptimizer
    scheduler: AcceleratedScheduler
    train_loader: DataLoader[Any]  # not prepared: the sampler yields this rank's share (position.rank_plan)
    train_sampler: EpochShuffleSampler
    make_batch: Callable[[Any], Batch]  # a loader's batch -> (uint8 crops, labels) on the device
    output_dir: Path
    checkpoint_dir: Path
    eval_build: EvalStoreBuild  # started after the first training step, collected at the first evaluation
    trackers: RunTrackers  # TensorBoard and MLflow, through accelerate (rank 0)
    layout: Layout  # the global batch at this world size; resume sets the checkpoint's
    eval_store: EvalStore | None = None
    attempt: int | None = None  # $PETS_ATTEMPT, the checkpoint fence's token (None: no fence)
    # rank 0's hostname when every machine shares checkpoint_dir (rank 0 alone publishes), else None
    shared_checkpoint_host: str | None = None


@dataclass
class RunState:
    """What carries from epoch to epoch; a checkpoint keeps the history, epoch times and elapsed time."""

    start_epoch: int = 0
    start_steps: int = 0  # steps of epoch start_epoch already done (resumed from a step checkpoint)
    # the resumed epoch's sums so far (all processes) and its training seconds before the save
    resumed_loss_sum: float = 0.0
    resumed_seen: float = 0.0
    resumed_seconds: float = 0.0
    resumed_counts: torch.Tensor | None = None  # how often each sample of the resumed epoch was trained
    history: list[dict[str, Any]] = field(default_factory=list)
    epoch_seconds: list[float] = field(default_factory=list)
    elapsed_before: float = 0.0  # seconds of training in earlier runs (resume)
    run_start: float = 0.0  # perf_counter when this run's first epoch began
    global_step: int = 0
    resume_step: int = 0  # the global step this run started at (0: fresh)
    skipped_checkpoints: int = 0  # newer step checkpoints it could not resume from (resume)
    steps_this_run: int = 0
    epochs_this_run: int = 0
    # this run's wall time by part; its "checkpoint" is the training loop blocked in checkpoint saves
    split: TimeSplit = field(default_factory=TimeSplit)
    clock: SaveClock = field(default_factory=lambda: SaveClock(0.0))
    stopped: str = ""  # why the run stopped mid-epoch after a stop request ("" : it did not)
    last_checkpoint: str = ""  # the name of the newest checkpoint this run saved

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.run_start

