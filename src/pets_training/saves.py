"""A run's checkpoints: where they go (one copy on a shared directory, else one per machine), saving an
epoch's or a step's, and resuming from the newest complete one that fits this run."""

from __future__ import annotations

import base64
import logging
import math
import secrets
import socket
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, gather_object

from .checkpoint import (
    SHARE_PROBE,
    Position,
    check_compatible,
    checkpoint_name,
    list_positions,
    read_trainer_state,
    save_atomically,
)
from .config import TrainConfig
from .contract import PermanentError
from .position import Layout, layout, samples_done, schedule_position, steps_done
from .progress import MetricsServer
from .run_state import RunState, Training

log = logging.getLogger("pets_training")


# trainer_state.json's "format": 2 records the global position (samples of the epoch's permutation done) and
# the global batch, and resumes at any world size; absent, 1 (v0.1.0), whose step position counts steps of
# its own world size.
FORMAT = 2


def _fingerprint(cfg: TrainConfig, num_classes: int) -> dict[str, Any]:
    """What must match for a checkpoint to continue this run. Not ``epochs``: a run resumed with more (or
    fewer) epochs continues, its schedule stretched to the new length (docs/operator.md)."""
    keys = ("model", "unfreeze", "image_size", "batch_size", "lr", "seed")
    return {**{k: getattr(cfg, k) for k in keys}, "num_classes": num_classes}


def checkpoint_fits(
    saved: dict[str, Any], is_step: bool, world_size: int, samples: int, batch_size: int
) -> str:
    """Why a checkpoint cannot continue this run exactly ("" when it can). Epoch checkpoints of either format
    fit any world size; a format-1 step checkpoint fits only its own world size and steps per epoch; a
    format-2 one any world size of an epoch of as many samples."""
    version = saved.get("format", 1)
    if not isinstance(version, int) or version > FORMAT:
        return f"format {version!r} is not one this trainer reads (1 to {FORMAT}): a newer trainer wrote it"
    if not is_step:
        return ""
    position = saved.get("position", {})
    if version == 1:
        steps_per_epoch = math.ceil(samples / (batch_size * world_size))
        here = {"world_size": world_size, "steps_per_epoch": steps_per_epoch}
        for key, value in here.items():
            if position.get(key) != value:
                return (f"format 1 (v0.1.0: its position counts steps of its own world size) was made with "
                        f"{key}={position.get(key)}, this run has {key}={value}")
        return ""
    if position.get("epoch_samples") != samples:
        return f"its epoch has {position.get('epoch_samples')} samples, this run's has {samples}"
    return ""


def resumed_position(saved: dict[str, Any], batch_size: int, samples: int) -> tuple[int | None, int]:
    """(the recorded global batch, samples of the epoch done) of a checkpoint that fits
    (:func:`checkpoint_fits`). Format 1 recorded no global batch: a step checkpoint's ran at one world size
    without accumulation (batch_size x its world size), an epoch checkpoint's is unknown (None)."""
    position = saved.get("position")
    if saved.get("format", 1) >= 2:
        return int(saved["global_batch"]), int(position["samples"]) if position else 0
    if not position:
        return None, 0
    global_batch = batch_size * int(position["world_size"])
    return global_batch, min(int(position["steps"]) * global_batch, samples)


def _common_checkpoints(accelerator: Accelerator, directory: Path) -> list[tuple[Position, Path]]:
    """The checkpoints (epoch and step) every process can see, newest first (machines may keep their own
    checkpoint directories)."""
    mine = {position: path for position, path in list_positions(directory)}
    common = set(mine).intersection(*map(set, gather_object([sorted(mine)])))
    return [(position, mine[position]) for position in sorted(common, reverse=True)]


def shared_checkpoint_host(accelerator: Accelerator, directory: Path, local_world_size: int) -> str | None:
    """Rank 0's hostname when every machine sees the same checkpoint directory (one claim mounted by every
    pod), else None (a directory per pod, some machines apart, or one machine: nothing to share).
    Rank 0 writes a probe file with a random token in its name; every process looks for it."""
    if accelerator.num_processes <= local_world_size:
        return None
    token, host = broadcast_object_list([secrets.token_hex(8), socket.gethostname()])  # rank 0's
    probe = directory / f"{SHARE_PROBE}{token}"
    if accelerator.is_main_process:
        directory.mkdir(parents=True, exist_ok=True)
        probe.touch()
    accelerator.wait_for_everyone()
    seen = gather_object([probe.exists()])  # every process has looked once this returns
    if accelerator.is_main_process:
        probe.unlink()
    shared = all(seen)
    log.info(
        "checkpoints: %s is %s",
        directory,
        "shared by every machine: rank 0 writes one copy (each rank its random states)"
        if shared
        else "not shared by every machine: each machine writes its own copy",
    )
    return host if shared else None


def _global_batch(
    cfg: TrainConfig, recorded: int | None, world_size: int, checkpoint: Path | None
) -> tuple[int, str]:
    """The run's global batch and where it comes from: the checkpoint's record, else --global-batch-size,
    else batch_size x world size (a first start). A flag that contradicts the record is refused."""
    if recorded is not None:
        if cfg.global_batch_size not in (None, recorded):
            raise PermanentError(
                f"resume: --global-batch-size (global_batch_size) {cfg.global_batch_size} differs from "
                f"{recorded}, recorded in checkpoint {str(checkpoint)!r} when the training first started; a "
                "training keeps its global batch: drop the flag or use another --checkpoint-dir"
            )
        return recorded, f" (recorded in {checkpoint})"
    if cfg.global_batch_size is not None:
        return cfg.global_batch_size, " (--global-batch-size)"
    return cfg.batch_size * world_size, f" (batch_size {cfg.batch_size} x {world_size} processes)"


def start_layout(cfg: TrainConfig, samples: int, world: int, recorded: int | None = None,
                 checkpoint: Path | None = None) -> Layout:
    """This run's epoch layout (position.py): its global batch kept at this world size, or ResizeError."""
    global_batch, where = _global_batch(cfg, recorded, world, checkpoint)
    lay = layout(samples, cfg.batch_size, global_batch, world, where)
    log.info("global batch %d%s: %d process(es) x batch_size %d x %d accumulation step(s); %d optimizer "
             "steps an epoch", global_batch, where, world, cfg.batch_size, lay.accumulation,
             lay.steps_per_epoch)
    return lay


def set_schedule(scheduler: Any, position: int) -> None:
    """Put the OneCycle schedule at ``position`` (position.schedule_position): its value is a function of
    the position alone, whatever stepped it before."""
    scheduler.last_epoch = position - 1
    with warnings.catch_warnings():  # a state just loaded: torch warns of a step before optimizer.step
        warnings.simplefilter("ignore", UserWarning)
        scheduler.step()


def resume(t: Training, cfg: TrainConfig) -> RunState:
    """Continue from the newest checkpoint every process has that fits (:func:`checkpoint_fits`): load its
    state, return its history and, for a step checkpoint, its global position in the epoch, which this
    run continues at its own world size. One that does not fit is skipped with a warning and counted."""
    skipped = 0
    world, samples = t.accelerator.num_processes, len(t.data.train)
    for (epochs, steps), path in _common_checkpoints(t.accelerator, t.checkpoint_dir):
        saved = read_trainer_state(path)
        check_compatible(saved["fingerprint"], _fingerprint(cfg, t.data.num_classes), path)
        why = checkpoint_fits(saved, bool(steps), world, samples, cfg.batch_size)
        if why:
            log.warning("resume: skipping %s checkpoint %s (format %s): %s; falling back to the newest epoch "
                        "checkpoint that fits, else a fresh start", "step" if steps else "epoch", path,
                        saved.get("format", 1), why)
            skipped += 1
            continue
        if epochs > cfg.epochs:
            raise PermanentError(f"resume: checkpoint {str(path)!r} has {epochs} epochs done, more than "
                                 f"epochs {cfg.epochs}: give at least {epochs}")
        recorded, done = resumed_position(saved, cfg.batch_size, samples)
        lay = t.layout = start_layout(cfg, samples, world, recorded, path)
        start_steps = steps_done(lay, done, f" of checkpoint {path}") if steps else 0
        fresh = t.scheduler.scheduler.state_dict()  # this run's schedule: its epochs (they may have changed)
        t.accelerator.load_state(str(path))
        t.scheduler.scheduler.load_state_dict(fresh)
        set_schedule(t.scheduler.scheduler, schedule_position(lay, epochs, done))
        state = RunState(
            start_epoch=epochs,
            history=saved["history"],
            epoch_seconds=saved["epoch_seconds"],
            elapsed_before=float(saved["elapsed_seconds"]),
            skipped_checkpoints=skipped,
        )
        if not steps:
            log.info("resume: continuing after epoch %d from %s", epochs, path)
            return state
        state.start_steps = start_steps
        state.resumed_loss_sum = float(saved["epoch_loss_sum"])
        state.resumed_seen = float(saved["epoch_seen"])
        state.resumed_seconds = float(saved["epoch_train_seconds"])
        state.resumed_counts = decode_counts(saved.get("epoch_sample_counts"), samples)
        position = saved["position"]
        log.info("resume: continuing at epoch %d step %d (global step %d) from %s: sample %d of %d, made "
                 "at world size %s, now %d", epochs + 1, start_steps, position["global_step"], path, done,
                 samples, position["world_size"], world)
        return state
    log.info("resume: no complete checkpoint in %s; starting fresh", t.checkpoint_dir)
    return RunState(skipped_checkpoints=skipped)


def encode_counts(counts: torch.Tensor) -> str:
    """Per-sample counts (how often each sample of the epoch was trained) as base64 bytes, capped at 255."""
    return base64.b64encode(counts.clamp(max=255).to(torch.uint8).numpy().tobytes()).decode()


def decode_counts(text: str | None, samples: int) -> torch.Tensor | None:
    """:func:`encode_counts` back, or None when absent (a format-1 checkpoint) or of another epoch size."""
    if not text:
        return None
    raw = base64.b64decode(text)
    if len(raw) != samples:
        return None
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(torch.int32)


def save_checkpoint(
    t: Training,
    cfg: TrainConfig,
    state: RunState,
    epochs: int,
    steps: int,
    extra: dict[str, Any],
    metrics: MetricsServer | None,
) -> None:
    """Save ``epoch_<epochs>`` (``steps`` 0) or the step checkpoint ``epoch_<epochs>_step_<steps>`` (every
    process calls this at the same step); the seconds the training loop was blocked are logged and added to
    ``pets_checkpoint_seconds_total`` (the run's checkpoint time)."""
    started = state.split.charge()
    shared = t.shared_checkpoint_host is not None
    save_atomically(
        t.checkpoint_dir,
        epochs,
        t.accelerator.save_state,
        {
            "fingerprint": _fingerprint(cfg, t.data.num_classes),
            "history": state.history,
            "epoch_seconds": state.epoch_seconds,
            "elapsed_seconds": state.elapsed(),
            "attempt": t.attempt,
            "format": FORMAT,
            "global_batch": t.layout.global_batch,
            "epochs": cfg.epochs,
            **extra,
        },
        t.accelerator.is_main_process if shared else t.accelerator.is_local_main_process,
        t.accelerator.wait_for_everyone,
        cfg.keep_checkpoints,
        t.attempt,
        t.shared_checkpoint_host,
        step=steps,
    )
    blocked = state.split.charge("checkpoint") - started
    total = state.split.seconds["checkpoint"]
    state.last_checkpoint = checkpoint_name(epochs, steps)
    log.info("checkpoint %s saved (global step %d): training blocked %.2f s (%.2f s in this run)",
             checkpoint_name(epochs, steps), state.global_step, blocked, total)
    if metrics is not None:
        if not steps:
            metrics.set("checkpoint_epoch", epochs)  # renamed into place: complete
        metrics.set("checkpoint_step", state.global_step)
        metrics.set("checkpoint_last_seconds", blocked)
        metrics.set("checkpoint_seconds_total", total)


def save_step_checkpoint(
    t: Training,
    cfg: TrainConfig,
    state: RunState,
    epoch: int,
    steps: int,
    sums: tuple[torch.Tensor, torch.Tensor],
    counts: torch.Tensor,
    epoch_start: float,
    metrics: MetricsServer | None,
) -> None:
    """The step checkpoint after ``steps`` optimizer steps of epoch index ``epoch``: the state, plus the
    global position, the epoch's loss sums so far (summed over the processes) so that the resumed epoch
    reports the same train loss, and how often each sample of the epoch was trained so far."""
    loss_sum = t.accelerator.reduce(sums[0], "sum")
    seen = t.accelerator.reduce(sums[1], "sum")
    trained = reduce_counts(t, counts)
    extra = {
        "position": {
            "epoch": epoch,  # epochs done: this one is epoch + 1 of cfg.epochs
            "steps": steps,  # optimizer steps of the global batch in this epoch
            "samples": samples_done(t.layout, steps),  # of the epoch's permutation, every rank together
            "epoch_samples": t.layout.samples,
            "global_step": state.global_step,
            "world_size": t.layout.world_size,
            "accumulation": t.layout.accumulation,
            # v0.1.0 reads these two: after a rollback it resumes here when they match its own run's
            # (accumulation 1: its steps are ours), else it skips this checkpoint
            "steps_per_epoch": t.layout.steps_per_epoch,
        },
        "epoch_loss_sum": float(loss_sum.item()),
        "epoch_seen": float(seen.item()),
        "epoch_train_seconds": time.perf_counter() - epoch_start,
        "epoch_sample_counts": encode_counts(trained),
    }
    save_checkpoint(t, cfg, state, epoch, steps, extra, metrics)


def reduce_counts(t: Training, counts: torch.Tensor) -> torch.Tensor:
    """Every process's per-sample counts summed (every process calls this at the same step), on the CPU."""
    return t.accelerator.reduce(counts.to(t.accelerator.device), "sum").cpu()  # type: ignore[no-any-return]
