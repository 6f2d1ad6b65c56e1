"""``training_function``: the Accelerate Pets recipe, read top to bottom like the tutorial.

``setup`` (accelerator, seed, data, model, optimiser and OneCycle schedule, prepare) -> ``resume`` ->
per epoch ``run_epoch`` (``train_epoch``, evaluate with gather_for_metrics, record progress, checkpoint) ->
weights, plot, summary. With ``--checkpoint-interval-seconds`` ``train_epoch`` also saves step checkpoints
mid-epoch (``epoch_<N>_step_<B>``), which ``resume`` continues exactly: same data order, same schedule.
The speed tricks (channels_last, bf16 autocast, the no-grad frozen backbone, uint8 batches normalised on
the device, CPU-quota-sized threads and workers) live in small helpers and do not change what is computed.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.data_loader import skip_first_batches
from accelerate.utils import ProjectConfiguration, broadcast_object_list, gather_object, set_seed
from torch import nn

from pets_contract.gauges import DATASET_COUNTS

from .checkpoint import (
    SHARE_PROBE,
    Position,
    attempt_from_env,
    check_compatible,
    checkpoint_name,
    claim,
    list_positions,
    read_trainer_state,
    save_atomically,
)
from .config import TrainConfig, resolve, to_yaml
from .contract import PodContract, ProcessContext
from .data import EpochShuffleSampler, PetsData, build_data, check_fits_world, report_counts, write_report
from .inputs import Batch, EvalStore, EvalStoreBuild, evaluate, start_worker_server, train_loader
from .model import cpu_runs_bf16_natively, create_model, inner_model, resolve_precision, trainable_module
from .progress import (
    PLOT_FILE,
    SUMMARY_FILE,
    MetricsServer,
    StepProgress,
    TimeSplit,
    append_progress,
    epoch_record,
    plot_metrics,
    write_summary,
)
from .resources import CpuLimit, CpuPlan, cpu_limit, plan_cpu
from .stepsave import SaveClock, StopRequest, decide
from .store import use_store

if TYPE_CHECKING:
    from accelerate.data_loader import DataLoaderShard
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.scheduler import AcceleratedScheduler

log = logging.getLogger("pets_training")
rank_log = logging.getLogger("pets_training.rank")  # INFO on every rank: one "ready" line per process

StepHook = Callable[[int, int], None]  # (global step, images in this step across all processes)


def setup_logging(rank: int) -> None:
    """INFO lines from the main process (and ``rank_log`` from every process), warnings and errors from every
    process, each with its rank."""
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


def _shared_checkpoint_host(accelerator: Accelerator, directory: Path, local_world_size: int) -> str | None:
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


@dataclass
class Training:
    """What setup made: the accelerator, what it prepared, and where the outputs go."""

    accelerator: Accelerator
    data: PetsData
    module: nn.Module
    normalise: Normalise
    optimizer: AcceleratedOptimizer
    scheduler: AcceleratedScheduler
    train_loader: DataLoaderShard
    train_sampler: EpochShuffleSampler
    make_batch: Callable[[Any], Batch]  # a loader's batch -> (uint8 crops, labels) on the device
    output_dir: Path
    checkpoint_dir: Path
    eval_build: EvalStoreBuild  # started after the first training step, collected at the first evaluation
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


def training_function(
    config: TrainConfig | Mapping[str, Any] | None = None,
    step_hook: StepHook | None = None,
    pod: PodContract | None = None,
    process: ProcessContext | None = None,
    stop: StopRequest | None = None,
) -> dict[str, Any] | None:
    """Train per ``config`` (a TrainConfig or a dict of settings); returns the summary on rank 0 when the run
    finished, else None. This is also the function ``accelerate.notebook_launcher`` runs. ``pod`` and
    ``process`` are read from the environment unless the caller has read them. ``stop``, once set, ends
    the run after the current step with a step checkpoint (every rank agrees on the step)."""
    split = TimeSplit()  # the start of this run: its time counts from here (docs/trainer.md)
    cfg = config if isinstance(config, TrainConfig) else resolve(overrides=config or {})
    pod = PodContract.from_env(os.environ) if pod is None else pod
    process = ProcessContext.from_env(os.environ) if process is None else process
    attempt = attempt_from_env(os.environ)
    if attempt is not None and cfg.checkpoints and process.local_rank == 0:
        # before anything else: a superseded trainer stops here, having written nothing
        claim(cfg.resolved_checkpoint_dir(pod.output_dir), attempt)
    t = setup(cfg, pod, process)
    t.attempt = attempt
    split.charge()
    state = resume(t, cfg) if cfg.resume else RunState()
    split.charge("restore" if cfg.resume else None)
    state.split = split
    state.clock = SaveClock(cfg.checkpoint_interval_seconds if cfg.checkpoints else 0.0)
    stop = StopRequest() if stop is None else stop

    metrics = MetricsServer(cfg.metrics_port) if t.accelerator.is_main_process and cfg.metrics_port else None
    state.run_start = time.perf_counter()
    state.global_step = state.resume_step = state.start_epoch * len(t.train_loader) + state.start_steps
    state.clock.start()
    if metrics is not None:
        if state.history:
            metrics.update(state.history[-1])
        metrics.set("step", state.global_step)
        metrics.set("steps_total", len(t.train_loader) * cfg.epochs)
        metrics.set("checkpoint_epoch", state.start_epoch)  # resumed from it (0: none)
        metrics.set("checkpoint_step", state.global_step)
        metrics.set("checkpoint_seconds_total", 0.0)
        metrics.set("resume_step", state.resume_step)
        metrics.set("resume_skipped_checkpoints", state.skipped_checkpoints)
        for key, value in report_counts(t.data.report).items():
            if key in DATASET_COUNTS:
                metrics.set(f"dataset_{key}", value)
        _serve_time(metrics, split)
    try:
        for epoch in range(state.start_epoch, cfg.epochs):
            run_epoch(t, cfg, state, epoch, metrics, step_hook, stop)
            if not state.stopped and epoch + 1 < cfg.epochs:
                # a stop asked during the eval or the epoch's save: stop here, at the epoch checkpoint
                if decide(False, stop.requested, t.accelerator.is_main_process, t.accelerator.num_processes,
                          t.accelerator.device)[1]:
                    state.stopped = stop.reason or "asked to stop"
            if state.stopped:
                _end_of_loop(split, metrics)
                stop.stopped, stop.global_step = True, state.global_step
                stop.checkpoint = state.last_checkpoint
                stop.time_seconds = split.rounded()
                log.info("stopped at global step %d (%s); continue with --resume", state.global_step,
                         state.stopped)
                return _end(t.accelerator, None)
            if _step_limit_reached(cfg, state):
                log.info("stopping after %d training steps (--max-train-steps)", state.steps_this_run)
                break
            if _pause_here(cfg, state, epoch):
                _end_of_loop(split, metrics)
                return _end(t.accelerator, None)
        _end_of_loop(split, metrics)
        summary = _finish(t.accelerator, t.module, cfg, t.data, state.history, t.output_dir, state.elapsed(),
                          split.rounded(), state.resume_step, state.skipped_checkpoints)
        return _end(t.accelerator, summary)
    finally:
        if metrics is not None:
            metrics.close()


def _serve_time(metrics: MetricsServer | None, split: TimeSplit) -> None:
    """The time gauges that grow during the run (rank 0); startup is set once, at the first step."""
    if metrics is not None:
        metrics.set("train_seconds_total", split.seconds["train"])
        metrics.set("eval_seconds_total", split.seconds["eval"])
        metrics.set("restore_seconds", split.seconds["restore"])


def _end_of_loop(split: TimeSplit, metrics: MetricsServer | None) -> None:
    """The epoch loop is over (finished, stopped or paused): its last piece is train (startup when this run
    took no step); what follows, the weights, plot and summary, is counted in no part."""
    split.charge()
    _serve_time(metrics, split)


def setup(cfg: TrainConfig, pod: PodContract, process: ProcessContext) -> Training:
    """Accelerator, data, model, optimiser and OneCycle schedule, prepared by accelerate."""
    on_gpu = torch.cuda.is_available()
    output_dir = cfg.resolved_output_dir(pod.output_dir)
    limit = cpu_limit(pod.cpu_limit)
    cpu = plan_cpu(limit.cpus, process.local_world_size, cfg.threads, cfg.num_workers)
    if cpu.workers:
        start_worker_server()  # before Accelerator(): no thread of gloo or ours exists yet
    accelerator = _make_accelerator(cfg, process, on_gpu, output_dir, limit, cpu)
    workers = cpu.workers

    data = build_data(
        cfg.data,
        cfg.image_size,
        cfg.seed,
        cfg.train_fraction,
        cfg.synthetic_classes,
        cfg.synthetic_images_per_class,
        cfg.fast_decode,
        cfg.data_layout,
    )
    log.info("data %s; %d for training, %d for evaluation", data.source, len(data.train), len(data.eval))
    if cfg.input_store:  # the local main process builds it; the others read what it built
        if accelerator.is_local_main_process:
            log.info("%s", use_store(data, cfg.input_store, cfg.fast_decode))
        accelerator.wait_for_everyone()
        if not accelerator.is_local_main_process:
            use_store(data, cfg.input_store, cfg.fast_decode, build=False)
    if accelerator.is_main_process:  # before the world-size check, so a refused set is reported too
        log.info("dataset report: %s", write_report(data.report, output_dir))
    check_fits_world(len(data.train), len(data.eval), accelerator.num_processes, cfg.batch_size,
                     cfg.train_fraction, data.source)

    model = create_model(cfg.model, data.num_classes, cfg.pretrained, cfg.weights, cfg.pretrained_cache)
    module = trainable_module(model, cfg.unfreeze)
    if cfg.channels_last:
        module = module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    normalise = Normalise(model, accelerator.device, cfg.channels_last)

    loader, train_sampler, make_batch = train_loader(data, cfg, workers, accelerator.device)
    eval_build = EvalStoreBuild(data.eval, cfg.eval_batch_size, accelerator.process_index,
                                accelerator.num_processes, workers, accelerator.device)
    optimizer = torch.optim.Adam([p for p in module.parameters() if p.requires_grad], lr=cfg.lr / 25)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=cfg.lr, epochs=cfg.epochs, steps_per_epoch=len(loader)
    )
    module, optimizer, loader, scheduler = accelerator.prepare(module, optimizer, loader, scheduler)
    checkpoint_dir = cfg.resolved_checkpoint_dir(pod.output_dir)
    shared_host = None
    if cfg.checkpoints:
        shared_host = _shared_checkpoint_host(accelerator, checkpoint_dir, process.local_world_size)
        # shared: accelerate's own mode for a shared file system, one copy of the model, optimizer and
        # scheduler (rank 0's); every rank still writes its random_states_<rank>.pkl
        accelerator.project_configuration.save_on_each_node = shared_host is None
    return Training(accelerator, data, module, normalise, optimizer, scheduler, loader, train_sampler,
                    make_batch, output_dir, checkpoint_dir, eval_build, shared_checkpoint_host=shared_host)


def _make_accelerator(
    cfg: TrainConfig, process: ProcessContext, on_gpu: bool, output_dir: Path, limit: CpuLimit, cpu: CpuPlan
) -> Accelerator:
    """The Accelerator, the seed, and this process's threads (``cpu``, planned from ``limit``)."""
    requested = cfg.mixed_precision or process.mixed_precision or "fp16"
    precision = resolve_precision(requested, on_gpu, on_gpu or cpu_runs_bf16_natively())
    accelerator = Accelerator(
        cpu=not on_gpu,
        mixed_precision=precision.mixed_precision,
        project_config=ProjectConfiguration(project_dir=str(output_dir), save_on_each_node=True),
    )
    setup_logging(accelerator.process_index)

    local_processes = process.local_world_size
    torch.set_num_threads(cpu.threads)
    # eval batches have one shape (EvalStore) and training two at most: one algorithm search per shape
    torch.backends.cudnn.benchmark = on_gpu
    set_seed(cfg.seed)
    rank_log.info(
        "rank %d of %d ready: machine %d, local rank %d, device %s, %d threads, mixed precision %s",
        accelerator.process_index,
        accelerator.num_processes,
        accelerator.process_index // local_processes,
        accelerator.local_process_index,
        accelerator.device,
        torch.get_num_threads(),
        accelerator.mixed_precision,
    )
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "config.yaml").write_text(to_yaml(cfg))
        log.info("resolved config (also in %s):\n%s", output_dir / "config.yaml", to_yaml(cfg).rstrip())
        if precision.note:
            log.info(precision.note)
        log.info(
            "%d process(es) on %s, mixed precision %s; %d CPU(s) from %s -> %d thread(s) and %d DataLoader "
            "worker(s) per process",
            accelerator.num_processes,
            accelerator.device,
            precision.mixed_precision,
            limit.cpus,
            limit.source,
            cpu.threads,
            cpu.workers,
        )
    return accelerator


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


def run_epoch(
    t: Training,
    cfg: TrainConfig,
    state: RunState,
    epoch: int,
    metrics: MetricsServer | None,
    step_hook: StepHook | None,
    stop: StopRequest | None = None,
) -> None:
    """One epoch: train, evaluate across all processes, record progress (rank 0), checkpoint. Stopped on
    request mid-epoch (``state.stopped``): the step checkpoint is saved, and nothing else happens."""
    epoch_start = time.perf_counter()
    if epoch == state.start_epoch:
        epoch_start -= state.resumed_seconds  # the resumed epoch's time before its step checkpoint
    train_loss, images_per_second = train_epoch(t, cfg, state, epoch, epoch_start, step_hook, metrics, stop)
    if state.stopped:
        return
    state.split.charge()
    if t.eval_store is None:  # built once, by the first evaluation of this run
        t.eval_store = t.eval_build.collect()
        log.info("eval store: %d image(s) of this process in %d batch(es), %.1f MiB on %s",
                 t.eval_store.samples, len(t.eval_store),
                 t.eval_store.nbytes / 2**20, t.accelerator.device)
    correct, counted = evaluate(t.module, t.eval_store, t.accelerator, t.normalise)
    state.split.charge("eval")
    _serve_time(metrics, state.split)
    accuracy = correct / counted
    state.epoch_seconds.append(time.perf_counter() - epoch_start)
    elapsed = state.elapsed()
    record = epoch_record(
        epoch + 1, cfg.epochs, train_loss, accuracy, images_per_second, elapsed, state.epoch_seconds
    )
    state.history.append(record)
    state.epochs_this_run += 1
    if t.accelerator.is_main_process:
        append_progress(t.output_dir, record)
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
        save_checkpoint(t, cfg, state, epoch + 1, 0, {}, metrics)


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


def _save_step_checkpoint(
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


def train_step(t: Training, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """One optimiser step on one batch (the tutorial's loop body); returns the loss, detached.
    ``make bench``'s model-only ceiling runs exactly this on a batch kept in memory."""
    outputs = t.module(t.normalise(images))
    loss = F.cross_entropy(outputs, labels)
    t.accelerator.backward(loss)
    t.optimizer.step()
    t.scheduler.step()
    t.optimizer.zero_grad()
    return loss.detach()


def train_epoch(
    t: Training,
    cfg: TrainConfig,
    state: RunState,
    epoch: int,
    epoch_start: float,
    step_hook: StepHook | None,
    metrics: MetricsServer | None = None,
    stop: StopRequest | None = None,
) -> tuple[float, float]:
    """One pass over the training set; returns the mean loss and images per second of all processes.
    Sets the ``step`` gauge after every step (rank 0; a float write, no I/O). After every step all
    processes agree (:func:`.stepsave.decide`) whether to save a step checkpoint (rank 0's clock) and
    whether to stop (anyone's ``stop``). The epoch a step checkpoint resumes skips the steps it had done
    (accelerate's ``skip_first_batches``: the same order, since the sampler is seeded by the epoch)."""
    accelerator = t.accelerator
    world = accelerator.num_processes
    # the prepared loader re-sets its sampler's epoch from its own counter, which starts at 0 in a
    # resumed process: set it (and through it our sampler) to the real epoch
    t.train_loader.set_epoch(epoch)
    t.train_sampler.set_epoch(epoch)
    t.module.train()
    loss_sum = torch.zeros((), device=accelerator.device)
    seen = torch.zeros((), device=accelerator.device)
    done = state.start_steps if epoch == state.start_epoch else 0
    loader = t.train_loader
    if done:
        state.split.charge()
        loader = skip_first_batches(t.train_loader, done)  # keeps the loader's epoch (its iteration)
        state.split.charge("restore")  # the skip's setup (its indices are skipped at the first batch)
        if metrics is not None:
            metrics.set("restore_seconds", state.split.seconds["restore"])
        if accelerator.is_main_process:  # the epoch's sums before the save, counted once
            loss_sum += state.resumed_loss_sum
            seen += state.resumed_seen
    bar = StepProgress(len(t.train_loader), epoch + 1, cfg.epochs, accelerator.is_main_process, cfg.log_every)
    bar.step = done
    for batch in loader:
        images, labels = t.make_batch(batch)
        loss = train_step(t, images, labels)
        done += 1
        loss_sum += loss * labels.shape[0]
        seen += labels.shape[0]
        state.global_step += 1
        state.steps_this_run += 1
        if state.steps_this_run == 1:
            state.split.first_step_done()
            t.eval_build.start()  # its workers decode the eval shard while this epoch trains
            if accelerator.is_main_process:
                # make bench-e2e measures time-to-first-step from this line's log timestamp
                log.info("first training step done, %.1f s after the start of this run",
                         sum(state.split.seconds.values()))
            if metrics is not None:
                metrics.set("startup_seconds", state.split.seconds["startup"])
        else:
            state.split.charge()  # the step (its data included) and the bookkeeping since the last one
        if metrics is not None:
            metrics.set("step", state.global_step)
            metrics.set("train_seconds_total", state.split.seconds["train"])
        bar.update(loss, labels.shape[0] * world)
        if step_hook is not None:
            step_hook(state.global_step, labels.shape[0] * world)
        requested = stop is not None and stop.requested
        save, stopping = decide(state.clock.due(), requested, accelerator.is_main_process, world,
                                accelerator.device)
        if cfg.checkpoints and (save or stopping):
            _save_step_checkpoint(t, cfg, state, epoch, done, (loss_sum, seen), epoch_start, metrics)
            state.clock.start()
        if stopping:
            state.stopped = (stop.reason if stop is not None and stop.requested else "") or "asked to stop"
            break
        if _step_limit_reached(cfg, state):
            break
    bar.close()
    train_seconds = time.perf_counter() - epoch_start
    total_loss = accelerator.reduce(loss_sum, "sum")
    total_seen = accelerator.reduce(seen, "sum")
    train_loss = float(total_loss.item() / max(total_seen.item(), 1.0))
    return train_loss, float(total_seen.item()) / train_seconds


def _step_limit_reached(cfg: TrainConfig, state: RunState) -> bool:
    return cfg.max_train_steps is not None and state.steps_this_run >= cfg.max_train_steps


def _pause_here(cfg: TrainConfig, state: RunState, epoch: int) -> bool:
    """``--max-epochs-this-run``: stop (resumably) after this epoch, unless it is the last one anyway."""
    if cfg.max_epochs_this_run is None or state.epochs_this_run < cfg.max_epochs_this_run:
        return False
    if epoch + 1 >= cfg.epochs:
        return False
    log.info(
        "stopping after epoch %d as asked (--max-epochs-this-run %d); continue with --resume",
        epoch + 1,
        cfg.max_epochs_this_run,
    )
    return True


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
    time_seconds: dict[str, float],
    resume_step: int = 0,
    skipped_checkpoints: int = 0,
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
        "time_seconds": time_seconds,  # this run's wall time by part (rank 0's)
        "resume_step": resume_step,  # the global step this run resumed at (0: fresh): the work lost
        "resume_skipped_checkpoints": skipped_checkpoints,  # newer step checkpoints it could not use
        "world_size": accelerator.num_processes,
        "model": cfg.model,
        "num_classes": data.num_classes,
        "dataset": report_counts(data.report),
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
