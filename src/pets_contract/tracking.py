"""What the trainer tells the trackers (docs/watching.md): the scalars' tags in TensorBoard and MLflow, the
tags of an MLflow run, and the keys of the summary's ``tracking`` object. The directory and the run file
are in ``names`` (TENSORBOARD_DIR, MLFLOW_RUN_FILE); the env naming the training in ``env``."""

from __future__ import annotations

# Scalars every logged step (x: the global optimizer step).
LOSS = "train/loss"  # rank 0's batch loss at that step
LEARNING_RATE = "train/learning_rate"
IMAGES_PER_SECOND = "train/images_per_second"  # all processes, since the previous logged step
STEP_SCALARS = (LOSS, LEARNING_RATE, IMAGES_PER_SECOND)

# Scalars every epoch (x: the global step at the epoch's end), the figures of progress.jsonl.
EVAL_ACCURACY = "eval/accuracy"
EPOCH_TRAIN_LOSS = "epoch/train_loss"
EPOCH_IMAGES_PER_SECOND = "epoch/images_per_second"
EPOCH = "epoch"
EPOCH_SCALARS = (EVAL_ACCURACY, EPOCH_TRAIN_LOSS, EPOCH_IMAGES_PER_SECOND, EPOCH)

# An MLflow run's tags: the PetsTraining it belongs to (from env.TRAINING_ENV, when set).
TAG_NAMESPACE = "training.pets.dev/namespace"
TAG_NAME = "training.pets.dev/name"
TAG_UID = "training.pets.dev/uid"

# The summary's "tracking" object (summary.TRACKING).
TENSORBOARD = "tensorboard"  # the event files' directory, or absent when TensorBoard is off
MLFLOW_RUN_ID = "mlflow_run_id"
MLFLOW_URL = "mlflow_url"  # the run's page on the tracking server
OK = "ok"  # false: a tracking server failed (down, slow, refusing); the training went on without it
WARNING = "warning"  # the one line the trainer logged about it (URLs redacted)
