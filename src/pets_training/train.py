"""``training_function``: the Accelerate Pets recipe, read top to bottom like the tutorial.

``setup`` (accelerator, seed, data, model, optimiser and OneCycle schedule, prepare) -> ``resume`` ->
per epoch ``run_epoch`` (``train_epoch``, evaluate with gather_for_metrics, record progress, checkpoint) ->
weights, plot, summary. With ``--checkpoint-interval-seconds`` ``train_epoch`` also saves step checkpoints
mid-epoch (``epoch_<N>_step_<B>``), which ``resume`` continues exactly: same data order, same schedule.
The speed tricks (channels_last, bf16 autocast, the no-grad frozen backbone, uint8 batches normalised on
the device, CPU-quota-sized threads and workers) live in small helpers and do not change what is computed.
What a run holds is ``run_state``; its checkpoints (save, resume) are ``saves``; its end is ``finish``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed

from pets_contract.gauges import DATASET_COUNTS

from .checkpoint import claim
from .config import TrainConfig, resolve, to_yaml
from .contract import PodContract, ProcessContext, attempt_number, take_process_start
from .data import check_fits_world, write_report
from .finish import end_run, finish_run
from .gpus import use_gpu
from .inputs import (
    PAD_LABEL,
    Batch,
    EvalStoreBuild,
    evaluate,
    local_data,
    pad_batch,
    start_worker_server,
    train_loader,
)
from .model import adam, cpu_runs_bf16_natively, create_model, resolve_precision, trainable_module
from .position import loss_weight, rank_plan, samples_done, schedule_position, schedule_total, step_samples
from .progress import MetricsServer, StepProgress, TimeSplit, append_progress, epoch_record
from .resources import CpuLimit, CpuPlan, cpu_limit, plan_cpu
from .run_state import Normalise, RunState, Training
from .saves import (
    reduce_counts,
    resume,
    save_checkpoint,
    save_step_checkpoint,
    set_schedule,
    shared_checkpoint_host,
    start_layout,
)
from .stepsave import SaveClock, StopRequest, decide
from .tracking import FAILED, KILLED, SHORT_WAIT, RunTrackers, log_with

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
    # the start of this run: its entry point's start, or this call's (docs/trainer.md)
    since_start = take_process_start(os.environ, time.time())
    split = TimeSplit(None if since_start is None else time.perf_counter() - since_start)
    if since_start is not None:
        split.startup_done("imports")  # the entry point's start to here: imports and arguments
    cfg = config if isinstance(config, TrainConfig) else resolve(overrides=config or {})
    pod = PodContract.from_env(os.environ) if pod is None else pod
    process = ProcessContext.from_env(os.environ) if process is None else process
    attempt = attempt_number(os.environ)  # the checkpoint fence's token (None: no fence)
    if attempt is not None and cfg.checkpoints and process.local_rank == 0:
        # before anything else: a superseded trainer stops here, having written nothing
        claim(cfg.resolved_checkpoint_dir(pod.output_dir), attempt)
    t = setup(cfg, pod, process, split)
    t.attempt = attempt
    split.charge()
    state = resume(t, cfg) if cfg.resume else RunState()
    split.charge("restore" if cfg.resume else None)
    split.startup_done("resume")
    state.split = split
    state.clock = SaveClock(cfg.checkpoint_interval_seconds if cfg.checkpoints else 0.0)
    stop = StopRequest() if stop is None else stop

    metrics = MetricsServer(cfg.metrics_port) if t.accelerator.is_main_process and cfg.metrics_port else None
    state.global_step = state.resume_step = state.start_epoch * t.layout.steps_per_epoch + state.start_steps
    t.trackers.start(cfg, state.global_step, _failure_gauge(metrics))  # after a resume: TensorBoard's purge
    state.run_start = time.perf_counter()
    state.clock.start()
    if metrics is not None:
        if state.history:
            metrics.update(state.history[-1])
        metrics.set("step", state.global_step)
        metrics.set("steps_total", t.layout.steps_per_epoch * cfg.epochs)
        metrics.set("checkpoint_epoch", state.start_epoch)  # resumed from it (0: none)
        metrics.set("checkpoint_step", state.global_step)
        metrics.set("checkpoint_seconds_total", 0.0)
        metrics.set("resume_step", state.resume_step)
        metrics.set("resume_skipped_checkpoints", state.skipped_checkpoints)
        metrics.set("tracking_failures", 0)
        for key in DATASET_COUNTS:
            metrics.set(f"dataset_{key}", t.data.report[key])
        _serve_time(metrics, split)
    try:
        for epoch in range(state.start_epoch, cfg.epochs):
            run_epoch(t, cfg, state, epoch, metrics, step_hook, stop)
            if not state.stopped and epoch + 1 < cfg.epochs:
                # a stop asked during the eval or the epoch's save: stop here, at the epoch checkpoint
                if decide(False, stop.requested, t.accelerator.is_main_process,
                          t.accelerator.num_processes)[1]:
                    state.stopped = stop.reason or "asked to stop"
            if state.stopped:
                _end_of_loop(split, metrics)
                stop.stopped, stop.global_step = True, state.global_step
                stop.checkpoint = state.last_checkpoint
                stop.time_seconds = split.rounded()
                log.info("stopped at global step %d (%s); continue with --resume", state.global_step,
                         state.stopped)
                t.trackers.close(KILLED, wait=SHORT_WAIT)  # within the pod's grace period
                return end_run(t.accelerator, None)
            if _step_limit_reached(cfg, state):
                log.info("stopping after %d training steps (--max-train-steps)", state.steps_this_run)
                break
            if _pause_here(cfg, state, epoch):
                _end_of_loop(split, metrics)
                t.trackers.close(KILLED)
                return end_run(t.accelerator, None)
        _end_of_loop(split, metrics)
        return end_run(t.accelerator, finish_run(t, cfg, state))
    except BaseException:
        split.charge()  # the failing piece, to its part
        # how far it got and where its time went, for the failure summary (cli.main)
        stop.global_step, stop.time_seconds = state.global_step, split.rounded()
        t.trackers.close(FAILED)
        raise
    finally:
        if metrics is not None:
            metrics.close()


def _failure_gauge(metrics: MetricsServer | None) -> Callable[[], None] | None:
    """What a tracker that fails does to the gauges: ``pets_tracking_failures`` 1 (rank 0)."""
    return None if metrics is None else lambda: metrics.set("tracking_failures", 1)


def _serve_time(metrics: MetricsServer | None, split: TimeSplit) -> None:
    """The time gauges that grow during the run (rank 0); startup is set once, at the first step."""
    if metrics is not None:
        metrics.set("train_seconds_total", split.seconds["train"])
        metrics.set("train_input_wait_seconds_total", split.input_wait)
        metrics.set("eval_seconds_total", split.seconds["eval"])
        metrics.set("restore_seconds", split.seconds["restore"])


def _end_of_loop(split: TimeSplit, metrics: MetricsServer | None) -> None:
    """The epoch loop is over (finished, stopped or paused): its last piece is train (startup when this run
    took no step); what follows, the weights, plot and summary, is counted in no part."""
    split.charge()
    _serve_time(metrics, split)


def setup(cfg: TrainConfig, pod: PodContract, process: ProcessContext,
          split: TimeSplit | None = None) -> Training:
    """Accelerator, data, model, optimiser and OneCycle schedule, prepared by accelerate (each part's time
    in ``split``'s start-up parts)."""
    done = split.startup_done if split is not None else lambda part: None
    on_gpu = use_gpu(pod.gpus, os.environ)  # a pod given GPUs and finding fewer fails here, saying why
    output_dir = cfg.resolved_output_dir(pod.output_dir)
    limit = cpu_limit(pod.cpu_limit)
    cpu = plan_cpu(limit.cpus, process.local_world_size, cfg.threads, cfg.num_workers)
    if cpu.workers:
        start_worker_server()  # before Accelerator(): no thread of gloo or ours exists yet
    accelerator = _make_accelerator(cfg, process, on_gpu, output_dir, limit, cpu)
    done("accelerator")
    data = local_data(cfg, accelerator, output_dir)
    if accelerator.is_main_process:  # before the world-size check, so a refused set is reported too
        log.info("dataset report: %s", write_report(data.report, output_dir))
    check_fits_world(len(data.train), len(data.eval), accelerator.num_processes, cfg.batch_size,
                     cfg.train_fraction, data.source)

    done("data")  # every file checked (or its check read from the index), the input store built or read
    model = create_model(cfg.model, data.num_classes, cfg.pretrained, cfg.weights, cfg.pretrained_cache)
    module = trainable_module(model, cfg.unfreeze)
    if cfg.channels_last:
        module = module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    normalise = Normalise(model, accelerator.device, cfg.channels_last)
    done("model")
    loader, train_sampler, make_batch = train_loader(data, cfg, cpu.workers, accelerator.device)
    # evaluated in batches of the training batch's shape: one input shape for the model (one cuDNN search)
    eval_build = EvalStoreBuild(data.eval, cfg.batch_size, accelerator.process_index,
                                accelerator.num_processes, cpu.workers, accelerator.device)
    lay = start_layout(cfg, len(data.train), accelerator.num_processes)
    optimizer = adam([p for p in module.parameters() if p.requires_grad], lr=cfg.lr / 25)
    # counted in chunks of batch_size samples (position.py): the same at any world size
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=cfg.lr,
                                                    total_steps=schedule_total(lay, cfg.epochs))
    # the training loader is not prepared: its sampler shards the epoch itself (position.rank_plan)
    module, optimizer, scheduler = accelerator.prepare(module, optimizer, scheduler)
    checkpoint_dir = cfg.resolved_checkpoint_dir(pod.output_dir)
    shared_host = None
    if cfg.checkpoints:
        shared_host = shared_checkpoint_host(accelerator, checkpoint_dir, process.local_world_size)
        # shared: accelerate's own mode for a shared file system, one copy of the model, optimizer and
        # scheduler (rank 0's); every rank still writes its random_states_<rank>.pkl
        accelerator.project_configuration.save_on_each_node = shared_host is None
    trackers = RunTrackers(accelerator, cfg, output_dir)
    done("loaders and prepare")
    return Training(accelerator, data, module, normalise, optimizer, scheduler, loader, train_sampler,
                    make_batch, output_dir, checkpoint_dir, eval_build, trackers, lay,
                    shared_checkpoint_host=shared_host)


def _make_accelerator(
    cfg: TrainConfig, process: ProcessContext, on_gpu: bool, output_dir: Path, limit: CpuLimit, cpu: CpuPlan
) -> Accelerator:
    """The Accelerator, the seed, and this process's threads (``cpu``, planned from ``limit``)."""
    requested = cfg.mixed_precision or process.mixed_precision or "auto"
    capability = torch.cuda.get_device_capability(process.local_rank) if on_gpu else None
    precision = resolve_precision(requested, on_gpu, on_gpu or cpu_runs_bf16_natively(), capability)
    accelerator = Accelerator(
        cpu=not on_gpu,
        mixed_precision=precision.mixed_precision,
        project_config=ProjectConfiguration(project_dir=str(output_dir), save_on_each_node=True),
        log_with=log_with(cfg, output_dir, os.environ),  # logging_dir: project_dir, <output>/tensorboard
    )
    setup_logging(accelerator.process_index)

    torch.set_num_threads(cpu.threads)
    # the model sees one input shape (the eval batches and an epoch's last batch padded): one search
    torch.backends.cudnn.benchmark = on_gpu
    set_seed(cfg.seed)
    rank_log.info(
        "rank %d of %d ready: machine %d, local rank %d, device %s, %d threads, mixed precision %s",
        accelerator.process_index,
        accelerator.num_processes,
        accelerator.process_index // process.local_world_size,
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


def run_epoch(
    t: Training,
    cfg: TrainConfig,
    state: RunState,
    epoch: int,
    metrics: MetricsServer | None,
    step_hook: StepHook | None,
    stop: StopRequest,
) -> None:
    """One epoch: train, evaluate across all processes, record progress (rank 0), checkpoint. Stopped on
    request mid-epoch (``state.stopped``): the step checkpoint is saved, and nothing else happens."""
    epoch_start = time.perf_counter()
    if epoch == state.start_epoch:
        epoch_start -= state.resumed_seconds  # the resumed epoch's time before its step checkpoint
    train_loss, images_per_second, coverage = train_epoch(t, cfg, state, epoch, epoch_start, step_hook,
                                                          metrics, stop)
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
        epoch + 1, cfg.epochs, train_loss, accuracy, images_per_second, elapsed, state.epoch_seconds, coverage
    )
    state.history.append(record)
    state.epochs_this_run += 1
    if t.accelerator.is_main_process:
        append_progress(t.output_dir, record)
        t.trackers.epoch(record, state.global_step)
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


def train_step(t: Training, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """One optimiser step on one batch, as the tutorial's loop body; returns the mean loss, detached.
    ``make bench``'s model-only ceiling runs this on a batch kept in memory; the training loop runs its two
    halves, :func:`forward_backward` per micro-batch and :func:`optimizer_step` per global batch."""
    loss = forward_backward(t, images, labels, 1.0 / labels.shape[0])
    t.optimizer.step()
    t.scheduler.step()
    t.optimizer.zero_grad()
    return loss / labels.shape[0]


def forward_backward(t: Training, images: torch.Tensor, labels: torch.Tensor, weight: float) -> torch.Tensor:
    """Forward and backward of one micro-batch, its loss summed over the samples x ``weight``
    (position.loss_weight); returns the summed loss, detached. A short batch is padded to the batch size
    (inputs.pad_batch), its padding left out of the loss."""
    images, labels = pad_batch(images, labels, t.layout.batch_size)
    outputs = t.module(t.normalise(images))
    loss = F.cross_entropy(outputs, labels, reduction="sum", ignore_index=PAD_LABEL)
    t.accelerator.backward(loss * weight)
    return loss.detach()


def optimizer_step(t: Training, schedule: int) -> None:
    """The step of one global batch, with the schedule at ``schedule`` (position.schedule_position)."""
    t.optimizer.step()
    set_schedule(t.scheduler.scheduler, schedule)
    t.optimizer.zero_grad()


def train_epoch(
    t: Training,
    cfg: TrainConfig,
    state: RunState,
    epoch: int,
    epoch_start: float,
    step_hook: StepHook | None,
    metrics: MetricsServer | None,
    stop: StopRequest,
) -> tuple[float, float, tuple[int, int] | None]:
    """One pass over the training set; returns the mean loss and images per second of all processes, and
    (samples trained, distinct samples) of the epoch, every process and resumed run together (None: not
    known). Sets the
    ``step`` gauge after every optimizer step (rank 0; a float write, no I/O). Each optimizer step is this
    rank's micro-steps of the global batch (position.rank_plan), the gradient all-reduced on the last. After
    every step all processes agree (:func:`.stepsave.decide`) whether to save a step checkpoint (rank 0's
    clock) and whether to stop (anyone's ``stop``). A resumed epoch starts at its global position: the same
    order, since the sampler is seeded by the epoch, from the next sample, at any world size."""
    accelerator, lay = t.accelerator, t.layout
    done = state.start_steps if epoch == state.start_epoch else 0
    plan = rank_plan(lay, accelerator.process_index, done)
    t.train_sampler.set_epoch(epoch)
    t.train_sampler.set_plan(plan)
    order = t.train_sampler.order()
    t.module.train()
    loss_sum = torch.zeros((), device=accelerator.device)
    seen = torch.zeros((), device=accelerator.device)
    counts = torch.zeros(lay.samples, dtype=torch.int32)  # how often this rank trained each sample
    if done and accelerator.is_main_process:  # the epoch's sums before the save, counted once
        loss_sum += state.resumed_loss_sum
        seen += state.resumed_seen
        if state.resumed_counts is not None:
            counts += state.resumed_counts
    bar = StepProgress(lay.steps_per_epoch, epoch + 1, cfg.epochs, accelerator.is_main_process, cfg.log_every)
    bar.step = done
    step_loss = torch.zeros((), device=accelerator.device)
    for micro, (images, labels) in zip(plan, _ready_batches(t, state.split), strict=True):
        with contextlib.nullcontext() if micro.last else accelerator.no_sync(t.module):
            loss = forward_backward(t, images, labels, loss_weight(lay, micro))
        if not micro.padding:
            loss_sum += loss
            seen += labels.shape[0]
            step_loss += loss / labels.shape[0]
            counts[order[micro.start:micro.end]] += 1
        if not micro.last:
            continue
        done = micro.step + 1
        optimizer_step(t, schedule_position(lay, epoch, samples_done(lay, done)))
        images_in_step = step_samples(lay, micro.step)
        state.global_step += 1
        state.steps_this_run += 1
        if state.steps_this_run == 1:
            state.split.first_step_done()
            t.eval_build.start()  # its workers decode the eval shard while this epoch trains
            # rank 0's (setup_logging); make bench-e2e measures time-to-first-step from its log timestamp
            log.info("first training step done, %.1f s after the start of this run",
                     sum(state.split.seconds.values()))
            if metrics is not None:
                metrics.set("startup_seconds", state.split.seconds["startup"])
        else:
            state.split.charge()  # the step (its data included) and the bookkeeping since the last one
        if metrics is not None:
            metrics.set("step", state.global_step)
            metrics.set("train_seconds_total", state.split.seconds["train"])
            metrics.set("train_input_wait_seconds_total", state.split.input_wait)
        step_loss /= lay.accumulation  # this rank's mean over its micro-steps (a padding one counts 0)
        bar.update(step_loss, images_in_step)
        t.trackers.step(state.global_step, step_loss, images_in_step, t.optimizer.param_groups[0]["lr"])
        if step_hook is not None:
            step_hook(state.global_step, images_in_step)
        step_loss = torch.zeros((), device=accelerator.device)
        save, stopping = decide(state.clock.due(), stop.requested, accelerator.is_main_process,
                                lay.world_size)
        if cfg.checkpoints and (save or stopping):
            save_step_checkpoint(t, cfg, state, epoch, done, (loss_sum, seen), counts, epoch_start, metrics)
            state.clock.start()
        if stopping:
            state.stopped = stop.reason or "asked to stop"
            break
        if _step_limit_reached(cfg, state):
            break
    bar.close()
    train_seconds = time.perf_counter() - epoch_start
    total_loss = accelerator.reduce(loss_sum, "sum")
    total_seen = accelerator.reduce(seen, "sum")
    trained = reduce_counts(t, counts)
    train_loss = float(total_loss.item() / max(total_seen.item(), 1.0))
    coverage: tuple[int, int] | None = (int(trained.sum().item()), int((trained > 0).sum().item()))
    if epoch == state.start_epoch and state.start_steps and state.resumed_counts is None:
        coverage = None  # resumed from a checkpoint that had no counts (format 1): not known
    return train_loss, float(total_seen.item()) / train_seconds, coverage


def _ready_batches(t: Training, split: TimeSplit) -> Iterator[Batch]:
    """The training loader's batches made ready for the step (``make_batch``: on the device input path,
    decoded and cropped there), the time each took counted as the loop's wait for input."""
    since = time.perf_counter()
    for batch in t.train_loader:
        ready = t.make_batch(batch)
        split.waited_for_input(since)
        split.startup_done("first batch")  # the loader's start and its first batch
        yield ready
        since = time.perf_counter()


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


