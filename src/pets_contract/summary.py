"""The trainer's final summary (docs/contract.md, "Summary"): one flat JSON object under 4 KiB, written to
<output>/summary.json and as rank 0's termination message, where the operator reads it."""

from __future__ import annotations

LIMIT = 4096  # a Kubernetes termination message holds 4 KiB

STATUS = "status"  # "succeeded", "failed" or "stopped"
SUCCEEDED = "succeeded"
FAILED = "failed"
STOPPED = "stopped"
ERROR = "error"
EPOCHS = "epochs"
FINAL_ACCURACY = "final_accuracy"
FINAL_TRAIN_LOSS = "final_train_loss"
IMAGES_PER_SECOND = "images_per_second"
ELAPSED_SECONDS = "elapsed_seconds"
TIME_SECONDS = "time_seconds"  # the run's wall time by part: gauges.TIME_PARTS
RESUME_STEP = "resume_step"
# The optimizer step the run reached: the global step (resumed runs included), numbered as the `step` gauge
# and status.step are. In every summary of a run that trained: its end, a SIGTERM's stop, a failure once its
# training loop began (a failure before it knows none). The operator takes it as that run's lastStep, exact
# where a progress read (every few seconds) may be behind.
GLOBAL_STEP = "global_step"
RESUME_SKIPPED_CHECKPOINTS = "resume_skipped_checkpoints"
DATASET = "dataset"  # the dataset report's counts (gauges.DATASET_COUNTS) and its layout
# The trackers' outcome (pets_contract.tracking): TensorBoard's directory, the MLflow run's id and URL, and
# whether the tracking server took everything (its "ok" false: a warning, never a failed training)
TRACKING = "tracking"

# The run's own final figures win over the last progress read (which may be an epoch old): each summary
# key -> the gauge (pets_contract.gauges) whose status field it sets.
FINAL_FIGURES = {
    FINAL_ACCURACY: "eval_accuracy",
    FINAL_TRAIN_LOSS: "train_loss",
    IMAGES_PER_SECOND: "images_per_second",
    ELAPSED_SECONDS: "elapsed_seconds",
    RESUME_SKIPPED_CHECKPOINTS: "resume_skipped_checkpoints",
}
