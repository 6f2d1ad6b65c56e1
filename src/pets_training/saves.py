"""A run's checkpoints: where they go (one copy on a shared directory, else one per machine), saving an
epoch's or a step's, and resuming from the newest complete one that fits this run."""

from __future__ import annotations

import logging
import secrets
import socket
import time
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
from .progress import MetricsServer
from .run_state import RunState, Training

log = logging.getLogger("pets_training")


def _fingerprint(cfg: TrainConfig, num_classes: int) -> dict[str, Any]:
    """What must match for a checkpoint to continue this run."""
    keys = ("model", "unfreeze", "image_size", "batch_size", "epochs", "lr", "seed")
    return {**{k: getattr(cfg, k) for k in keys}, "num_classes": num_classes}


def _common_checkpoints(accelerator: Accelerator, directory: Path) -> list[tuple[Position, Path]]:
    """The checkpoints (epoch and step) every process can see, newest first (machines may keep their own
    checkpoint directories)."""
    mine = {position: path for position, path in list_positions(directory)}
    everyone = gather_object([sorted(mine)])
    common = set(mine)
    for positions in everyone:
        common &= set(positions)
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


def _step_checkpoint_fits(saved: dict[str, Any], t: Training) -> str:
    """Why a step checkpoint cannot continue this run exactly ("" when it can): its position counts
    steps of its own world size and steps per epoch."""
    position = saved.get("position", {})
    here = {"steps_per_epoch": len(t.train_loader), "world_size": t.accelerator.num_processes}
    for key, value in here.items():
        if position.get(key) != value:
            return f"it was made with {key}={position.get(key)}, this run has {key}={value}"
    return ""


def resume(t: Training, cfg: TrainConfig) -> RunState:
    """Continue from the newest checkpoint every process has (load its state, return its history and, for a
    step checkpoint, its position in the epoch). A step checkpoint of another world size or steps per
    epoch cannot continue exactly: the newest epoch checkpoint does instead (a warning says so, and the
    returned state counts it)."""
    skipped = 0
    for (epochs, steps), path in _common_checkpoints(t.accelerator, t.checkpoint_dir):
        saved = read_trainer_state(path)
        check_compatible(saved["fingerprint"], _fingerprint(cfg, t.data.num_classes), path)
        if steps:
            why = _step_checkpoint_fits(saved, t)
            if why:
                log.warning("resume: skipping step checkpoint %s: %s", path, why)
                skipped += 1
                continue
        t.accelerator.load_state(str(path))
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
        state.start_steps = steps
        state.resumed_loss_sum = float(saved["epoch_loss_sum"])
        state.resumed_seen = float(saved["epoch_seen"])
        state.resumed_seconds = float(saved["epoch_train_seconds"])
        log.info("resume: continuing at epoch %d step %d (global step %d) from %s", epochs + 1, steps,
                 saved["position"]["global_step"], path)
        return state
    log.info("resume: no complete checkpoint in %s; starting fresh", t.checkpoint_dir)
    return RunState(skipped_checkpoints=skipped)


def save_checkpoint(
    t: Training,
    cfg: TrainConfig,
    state: RunState,
    epochs: int,
    steps: int,
    extra: dict[str, Any],
    metrics: MetricsServer | None,
) -> float:
    """Save ``epoch_<epochs>`` (``steps`` 0) or the step checkpoint ``epoch_<epochs>_step_<steps>`` (every
    process calls this at the same step); returns the seconds the training loop was blocked, which are
    logged and added to ``pets_checkpoint_seconds_total`` (the run's checkpoint time)."""
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
            **extra,
        },
        t.accelerator.is_main_process if shared else t.accelerator.is_local_main_process,
        t.accelerator.wait_for_everyone,
        cfg.keep_checkpoints,
        t.attempt,
        t.shared_checkpoint_host,
        step=steps,
    )
    ended = time.perf_counter()
    blocked = ended - started
    state.split.charge("checkpoint", ended)
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
    return blocked


def save_step_checkpoint(
    t: Training,
    cfg: TrainConfig,
    state: RunState,
    epoch: int,
    steps: int,
    sums: tuple[torch.Tensor, torch.Tensor],
    epoch_start: float,
    metrics: MetricsServer | None,
) -> None:
    """The step checkpoint after ``steps`` steps of epoch index ``epoch``: the state, plus the position and
    the epoch's loss sums so far (summed over the processes) so that the resumed epoch reports the same
    train loss."""
    loss_sum = t.accelerator.reduce(sums[0], "sum")
    seen = t.accelerator.reduce(sums[1], "sum")
    extra = {
        "position": {
            "epoch": epoch,  # epochs done: this one is epoch + 1 of cfg.epochs
            "steps": steps,
            "global_step": state.global_step,
            "steps_per_epoch": len(t.train_loader),
            "world_size": t.accelerator.num_processes,
        },
        "epoch_loss_sum": float(loss_sum.item()),
        "epoch_seen": float(seen.item()),
        "epoch_train_seconds": time.perf_counter() - epoch_start,
    }
    save_checkpoint(t, cfg, state, epoch, steps, extra, metrics)

