"""``training_function``: the Accelerate Pets recipe, read top to bottom like the tutorial.

seed -> accelerator -> data -> model -> optimiser and OneCycle schedule -> prepare -> (resume) ->
per epoch: train, evaluate with gather_for_metrics, record progress, checkpoint -> weights, plot, summary.
The speed tricks (channels_last, bf16 autocast, the no-grad frozen backbone, uint8 batches normalised on
the device, CPU-quota-sized threads and workers) live in small helpers and do not change what is computed.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, gather_object, set_seed
from torch import nn
from torch.utils.data import DataLoader

from .checkpoint import check_compatible, list_checkpoints, read_trainer_state, save_atomically
from .config import TrainConfig, resolve, to_yaml
from .data import EpochShuffleSampler, PetsData, build_data
from .model import create_model, inner_model, resolve_precision, trainable_module
from .progress import (
    PLOT_FILE,
    SUMMARY_FILE,
    MetricsServer,
    StepProgress,
    append_progress,
    epoch_record,
    plot_metrics,
    write_summary,
)
from .resources import cpu_limit, plan_cpu

log = logging.getLogger("pets_training")
rank_log = logging.getLogger("pets_training.rank")  # INFO on every rank: one "ready" line per process

StepHook = Callable[[int, int], None]  # (global step, images in this step across all processes)


def setup_logging(rank: int | None = None) -> None:
    """INFO lines from the main process (and ``rank_log`` from every process), warnings and errors from every
    process, each with its rank."""
    if rank is None:
        rank = int(os.environ.get("RANK", "0"))
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(format=f"%(asctime)s %(levelname)s [rank {rank}] %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("pets_training").setLevel(logging.INFO if rank == 0 else logging.WARNING)
    rank_log.setLevel(logging.INFO)


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


def evaluate(
    model: nn.Module,
    loader: DataLoader,
    accelerator: Accelerator,
    normalise: Callable[[torch.Tensor], torch.Tensor],
    gather: str = "metrics",
) -> tuple[int, int]:
    """(correct, counted) over the eval set, across all processes.

    ``gather="metrics"`` uses ``gather_for_metrics``, which drops the samples the sharded loader repeated
    to give every process a full last batch; ``gather="plain"`` is the tutorial's ``gather``, which counts
    them when the eval set does not divide by the world size.
    """
    model.eval()
    correct = 0
    counted = 0
    with torch.no_grad():
        for images, labels in loader:
            predictions = model(normalise(images)).argmax(dim=-1)
            if gather == "metrics":
                predictions, labels = accelerator.gather_for_metrics((predictions, labels))
            elif gather == "plain":
                predictions, labels = accelerator.gather(predictions), accelerator.gather(labels)
            else:
                raise ValueError(f"gather must be 'metrics' or 'plain', got {gather!r}")
            correct += int((predictions == labels).sum().item())
            counted += int(labels.numel())
    return correct, counted


def _fingerprint(cfg: TrainConfig, num_classes: int) -> dict[str, Any]:
    """What must match for a checkpoint to continue this run."""
    keys = ("model", "unfreeze", "image_size", "batch_size", "epochs", "lr", "seed")
    return {**{k: getattr(cfg, k) for k in keys}, "num_classes": num_classes}


def _common_checkpoint(accelerator: Accelerator, directory: Path) -> tuple[int, Path] | None:
    """The newest checkpoint every process can see (machines may keep their own checkpoint directories)."""
    mine = {epoch: path for epoch, path in list_checkpoints(directory)}
    everyone = gather_object([sorted(mine)])
    common = set(mine)
    for epochs in everyone:
        common &= set(epochs)
    if not common:
        return None
    newest = max(common)
    return newest, mine[newest]


def _dataloaders(
    data: PetsData, cfg: TrainConfig, workers: int, pin: bool
) -> tuple[DataLoader, DataLoader, EpochShuffleSampler]:
    sampler = EpochShuffleSampler(len(data.train), cfg.seed)
    common: dict[str, Any] = {"num_workers": workers, "pin_memory": pin, "persistent_workers": workers > 0}
    train = DataLoader(data.train, batch_size=cfg.batch_size, sampler=sampler, **common)
    evals = DataLoader(data.eval, batch_size=cfg.eval_batch_size, shuffle=False, **common)
    return train, evals, sampler


def training_function(
    config: TrainConfig | Mapping[str, Any] | None = None,
    step_hook: StepHook | None = None,
) -> dict[str, Any] | None:
    """Train per ``config`` (a TrainConfig or a dict of settings); returns the summary on rank 0 when the run
    finished, else None. This is also the function ``accelerate.notebook_launcher`` runs."""
    cfg = config if isinstance(config, TrainConfig) else resolve(overrides=config or {})
    on_gpu = torch.cuda.is_available()
    requested = cfg.mixed_precision or os.environ.get("ACCELERATE_MIXED_PRECISION") or "fp16"
    precision = resolve_precision(requested, on_gpu)
    output_dir = cfg.resolved_output_dir()
    checkpoint_dir = cfg.resolved_checkpoint_dir()
    accelerator = Accelerator(
        cpu=not on_gpu,
        mixed_precision=precision.mixed_precision,
        project_config=ProjectConfiguration(project_dir=str(output_dir), save_on_each_node=True),
    )
    setup_logging(accelerator.process_index)
    main = accelerator.is_main_process
    world = accelerator.num_processes

    limit = cpu_limit()
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cpu = plan_cpu(limit.cpus, local_processes, cfg.threads, cfg.num_workers)
    torch.set_num_threads(cpu.threads)
    set_seed(cfg.seed)
    rank_log.info(
        "rank %d of %d ready: machine %d, local rank %d, device %s, %d threads, mixed precision %s",
        accelerator.process_index,
        world,
        accelerator.process_index // local_processes,
        accelerator.local_process_index,
        accelerator.device,
        torch.get_num_threads(),
        accelerator.mixed_precision,
    )

    if main:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "config.yaml").write_text(to_yaml(cfg))
        log.info("resolved config (also in %s):\n%s", output_dir / "config.yaml", to_yaml(cfg).rstrip())
        if precision.note:
            log.info(precision.note)
        log.info(
            "%d process(es) on %s, mixed precision %s; %d CPU(s) from %s -> %d thread(s) and %d DataLoader "
            "worker(s) per process",
            world,
            accelerator.device,
            precision.mixed_precision,
            limit.cpus,
            limit.source,
            cpu.threads,
            cpu.workers,
        )

    data = build_data(
        cfg.data,
        cfg.image_size,
        cfg.seed,
        cfg.train_fraction,
        cfg.synthetic_classes,
        cfg.synthetic_images_per_class,
        cfg.fast_decode,
    )
    log.info("data %s; %d for training, %d for evaluation", data.source, len(data.train), len(data.eval))

    model = create_model(cfg.model, data.num_classes, cfg.pretrained, cfg.weights)
    module = trainable_module(model, cfg.unfreeze)
    if cfg.channels_last:
        module = module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    normalise = Normalise(model, accelerator.device, cfg.channels_last)

    train_loader, eval_loader, train_sampler = _dataloaders(data, cfg, cpu.workers, pin=on_gpu)
    optimizer = torch.optim.Adam([p for p in module.parameters() if p.requires_grad], lr=cfg.lr / 25)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=cfg.lr, epochs=cfg.epochs, steps_per_epoch=len(train_loader)
    )
    module, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        module, optimizer, train_loader, eval_loader, scheduler
    )

    start_epoch, history, epoch_seconds, elapsed_before = 0, [], [], 0.0
    fingerprint = _fingerprint(cfg, data.num_classes)
    if cfg.resume:
        found = _common_checkpoint(accelerator, checkpoint_dir)
        if found is None:
            log.info("resume: no complete checkpoint in %s; starting fresh", checkpoint_dir)
        else:
            start_epoch, path = found
            saved = read_trainer_state(path)
            check_compatible(saved["fingerprint"], fingerprint, path)
            accelerator.load_state(str(path))
            history, epoch_seconds = saved["history"], saved["epoch_seconds"]
            elapsed_before = float(saved["elapsed_seconds"])
            log.info("resume: continuing after epoch %d from %s", start_epoch, path)

    metrics = MetricsServer(cfg.metrics_port) if main and cfg.metrics_port else None
    if metrics is not None and history:
        metrics.update(history[-1])
    run_start = time.perf_counter()
    global_step = start_epoch * len(train_loader)
    steps_this_run = 0
    epochs_this_run = 0
    try:
        for epoch in range(start_epoch, cfg.epochs):
            epoch_start = time.perf_counter()
            # the prepared loader re-sets its sampler's epoch from its own counter, which starts at 0 in a
            # resumed process: set it (and through it our sampler) to the real epoch
            train_loader.set_epoch(epoch)
            train_sampler.set_epoch(epoch)
            module.train()
            loss_sum = torch.zeros((), device=accelerator.device)
            seen = torch.zeros((), device=accelerator.device)
            bar = StepProgress(len(train_loader), epoch + 1, cfg.epochs, main, cfg.log_every)
            for images, labels in train_loader:
                outputs = module(normalise(images))
                loss = F.cross_entropy(outputs, labels)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                loss_sum += loss.detach() * labels.shape[0]
                seen += labels.shape[0]
                global_step += 1
                steps_this_run += 1
                if steps_this_run == 1 and main:
                    # make bench-e2e measures time-to-first-step from this line's log timestamp
                    log.info("first training step done, %.1f s after the start of this run",
                             time.perf_counter() - run_start)
                bar.update(loss.detach(), labels.shape[0] * world)
                if step_hook is not None:
                    step_hook(global_step, labels.shape[0] * world)
                if cfg.max_train_steps is not None and steps_this_run >= cfg.max_train_steps:
                    break
            bar.close()
            train_seconds = time.perf_counter() - epoch_start
            total_loss = accelerator.reduce(loss_sum, "sum")
            total_seen = accelerator.reduce(seen, "sum")
            train_loss = float(total_loss.item() / max(total_seen.item(), 1.0))
            images_per_second = float(total_seen.item()) / train_seconds

            correct, counted = evaluate(module, eval_loader, accelerator, normalise)
            accuracy = correct / counted
            epoch_seconds.append(time.perf_counter() - epoch_start)
            elapsed = elapsed_before + time.perf_counter() - run_start
            record = epoch_record(
                epoch + 1, cfg.epochs, train_loss, accuracy, images_per_second, elapsed, epoch_seconds
            )
            history.append(record)
            epochs_this_run += 1
            if main:
                append_progress(output_dir, record)
                if metrics is not None:
                    metrics.update(record)
                log.info(
                    "epoch %d/%d: train loss %.4f, eval accuracy %.2f %% (%d/%d), %.1f images/s, "
                    "elapsed %.0f s, ETA %.0f s",
                    epoch + 1,
                    cfg.epochs,
                    train_loss,
                    100 * accuracy,
                    correct,
                    counted,
                    images_per_second,
                    elapsed,
                    record["eta_seconds"],
                )
            if cfg.checkpoints:
                save_atomically(
                    checkpoint_dir,
                    epoch + 1,
                    accelerator.save_state,
                    {
                        "fingerprint": fingerprint,
                        "history": history,
                        "epoch_seconds": epoch_seconds,
                        "elapsed_seconds": elapsed,
                    },
                    accelerator.is_local_main_process,
                    accelerator.wait_for_everyone,
                    cfg.keep_checkpoints,
                )
            if cfg.max_train_steps is not None and steps_this_run >= cfg.max_train_steps:
                log.info("stopping after %d training steps (--max-train-steps)", steps_this_run)
                break
            if (
                cfg.max_epochs_this_run is not None
                and epochs_this_run >= cfg.max_epochs_this_run
                and epoch + 1 < cfg.epochs
            ):
                log.info(
                    "stopping after epoch %d as asked (--max-epochs-this-run %d); continue with --resume",
                    epoch + 1,
                    cfg.max_epochs_this_run,
                )
                return _end(accelerator, None)
        summary = _finish(
            accelerator,
            module,
            cfg,
            data,
            history,
            output_dir,
            elapsed_before + time.perf_counter() - run_start,
        )
        return _end(accelerator, summary)
    finally:
        if metrics is not None:
            metrics.close()


def _end(accelerator: Accelerator, result: dict[str, Any] | None) -> dict[str, Any] | None:
    """Every rank waits, then leaves the process group. A gloo group left to the interpreter's exit
    can abort a rank ("terminate called without an active exception") after a run that succeeded."""
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return result


def _finish(
    accelerator: Accelerator,
    module: nn.Module,
    cfg: TrainConfig,
    data: PetsData,
    history: list[dict[str, Any]],
    output_dir: Path,
    elapsed: float,
) -> dict[str, Any] | None:
    accelerator.wait_for_everyone()
    if not accelerator.is_main_process:
        return None
    from safetensors.torch import save_file

    model = inner_model(accelerator.unwrap_model(module))
    weights = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(
        weights,
        str(output_dir / "model.safetensors"),
        metadata={"model": cfg.model, "classes": ",".join(data.classes)},
    )
    if history:
        plot_metrics(history, output_dir / PLOT_FILE)
    last = history[-1] if history else {}
    summary = {
        "status": "succeeded",
        "epochs": int(last.get("epoch", 0)),
        "final_accuracy": last.get("eval_accuracy"),
        "best_accuracy": max((r["eval_accuracy"] for r in history), default=None),
        "final_train_loss": last.get("train_loss"),
        "images_per_second": round(sum(r["images_per_second"] for r in history) / len(history), 2)
        if history
        else None,
        "elapsed_seconds": round(elapsed, 2),
        "world_size": accelerator.num_processes,
        "model": cfg.model,
        "num_classes": data.num_classes,
        "output_dir": str(output_dir),
    }
    write_summary(summary, [output_dir / SUMMARY_FILE, cfg.summary_path])
    log.info(
        "done: accuracy %.2f %% after %d epoch(s); outputs in %s",
        100 * (summary["final_accuracy"] or 0),
        summary["epochs"],
        output_dir,
    )
    return summary
