"""How many samples an epoch trained (docs/operator.md, "Resizing a training"): keys of each progress.jsonl
record and of the summary, so that a test can check that an epoch resized in its middle trained every
sample once. Counted by the trainer from the samples its steps took, every process and every run of the
epoch together (a step checkpoint carries the counts so far); the padding of the last step is not counted.
An epoch trained each of its samples exactly once when both counts equal the training split's size
(dataset.json's ``train_images``)."""

from __future__ import annotations

SAMPLES_TRAINED = "samples_trained"  # progress.jsonl: the epoch's samples trained, repeats counted
SAMPLES_DISTINCT = "samples_distinct"  # progress.jsonl: the distinct samples among them
# The summary: the epochs (from 1) whose counts are not each of the training split once: [] when all are.
INEXACT_EPOCHS = "samples_inexact_epochs"
GLOBAL_BATCH = "global_batch_size"  # the summary: samples of one optimizer step, kept at any world size
