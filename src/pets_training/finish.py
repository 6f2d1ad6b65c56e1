"""The end of a run: the weights, the plot and the summary (rank 0), then every rank leaves the group."""

from __future__ import annotations

import logging
from typing import Any

from accelerate import Accelerator

from pets_contract import samples
from pets_contract import summary as summary_keys
from pets_contract.names import CONFIG_FILE, DATASET_REPORT_FILE, MODEL_FILE, PROGRESS_FILE

from .config import TrainConfig
from .data import report_counts
from .model import inner_model
from .progress import PLOT_FILE, SUMMARY_FILE, plot_metrics, write_summary
from .run_state import RunState, Training
from .tracking import FINISHED

log = logging.getLogger("pets_training")


def end_run(accelerator: Accelerator, result: dict[str, Any] | None) -> dict[str, Any] | None:
    """Every rank waits, then leaves the process group. A gloo group left to the interpreter's exit
    can abort a rank ("terminate called without an active exception") after a run that succeeded."""
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return result


def inexact_epochs(history: list[dict[str, Any]], train_samples: int) -> list[int]:
    """The epochs (from 1) whose sample counts say they did not train each training sample once; an epoch
    without counts (recorded before they were) is not judged."""
    return [r["epoch"] for r in history if samples.SAMPLES_TRAINED in r
            and (r[samples.SAMPLES_TRAINED], r[samples.SAMPLES_DISTINCT]) != (train_samples, train_samples)]


def finish_run(t: Training, cfg: TrainConfig, state: RunState) -> dict[str, Any] | None:
    """The weights, the plot and the summary (rank 0, after every rank is done), the files to the MLflow
    run and the summary with the trackers' outcome; returns it on rank 0, None elsewhere."""
    accelerator, data, history, output_dir = t.accelerator, t.data, state.history, t.output_dir
    elapsed, time_seconds = state.elapsed(), state.split.rounded()  # the run's, before the wait
    accelerator.wait_for_everyone()
    if not accelerator.is_main_process:
        return None
    from safetensors.torch import save_file

    model = inner_model(accelerator.unwrap_model(t.module))
    weights = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(
        weights,
        str(output_dir / MODEL_FILE),
        metadata={"model": cfg.model, "classes": ",".join(data.classes)},
    )
    if history:
        plot_metrics(history, output_dir / PLOT_FILE)
    last = history[-1] if history else {}
    summary = {
        summary_keys.STATUS: summary_keys.SUCCEEDED,
        summary_keys.EPOCHS: int(last.get("epoch", 0)),
        summary_keys.FINAL_ACCURACY: last.get("eval_accuracy"),
        "best_accuracy": max((r["eval_accuracy"] for r in history), default=None),
        summary_keys.FINAL_TRAIN_LOSS: last.get("train_loss"),
        summary_keys.IMAGES_PER_SECOND: round(sum(r["images_per_second"] for r in history) / len(history), 2)
        if history
        else None,
        summary_keys.ELAPSED_SECONDS: round(elapsed, 2),
        summary_keys.TIME_SECONDS: time_seconds,  # this run's wall time by part (rank 0's)
        "startup_parts": state.split.startup_parts,  # its start-up by what was done (make bench-startup)
        summary_keys.RESUME_STEP: state.resume_step,  # where this run resumed (0: fresh): the work lost
        summary_keys.GLOBAL_STEP: state.global_step,  # where it ended: the operator's exact lastStep
        summary_keys.RESUME_SKIPPED_CHECKPOINTS: state.skipped_checkpoints,  # newer ones it could not use
        "world_size": accelerator.num_processes,
        samples.GLOBAL_BATCH: t.layout.global_batch,
        samples.INEXACT_EPOCHS: inexact_epochs(history, len(data.train))[:20],
        "model": cfg.model,
        "num_classes": data.num_classes,
        summary_keys.DATASET: report_counts(data.report),
        "output_dir": str(output_dir),
    }
    paths = [output_dir / SUMMARY_FILE, cfg.summary_path]
    write_summary(summary, paths)
    log.info(
        "done: accuracy %.2f %% after %d epoch(s); outputs in %s",
        100 * (summary[summary_keys.FINAL_ACCURACY] or 0),
        summary[summary_keys.EPOCHS],
        output_dir,
    )
    files = [output_dir / name for name in (MODEL_FILE, SUMMARY_FILE, CONFIG_FILE, PROGRESS_FILE, PLOT_FILE,
                                            DATASET_REPORT_FILE)]
    # the files to the MLflow run, which ends FINISHED; the summary again, with the trackers' outcome
    summary[summary_keys.TRACKING] = t.trackers.close(FINISHED, files)
    write_summary(summary, paths)
    return summary

