"""Run by test_distributed.py under ``accelerate launch`` with 2 processes (not a test module itself).

Evaluates one model on an eval set of odd size with the tutorial's plain ``gather`` and with
``gather_for_metrics`` over accelerate's sharded loader (the trainer's evaluation before its eval store),
and with the trainer's own ``evaluate`` over its eval store (shards padded and masked to the training
batch's shape, 4 here); rank 0 prints the counts as JSON.
"""

import json
import os
import sys

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from pets_training.data import build_data
from pets_training.inputs import build_eval_store, evaluate
from pets_training.model import create_model, trainable_module
from pets_training.train import Normalise


def loader_evaluate(gather: str) -> tuple[int, int]:
    """The evaluation over accelerate's sharded loader, with either gather."""
    module.eval()
    correct = counted = 0
    with torch.no_grad():
        for images, labels in loader:
            predictions = module(normalise(images)).argmax(dim=-1)
            if gather == "metrics":
                predictions, labels = accelerator.gather_for_metrics((predictions, labels))
            else:
                predictions, labels = accelerator.gather(predictions), accelerator.gather(labels)
            correct += int((predictions == labels).sum().item())
            counted += int(labels.numel())
    return correct, counted


accelerator = Accelerator(cpu=True)
data = build_data("synthetic", 32, 42, 0.8, 3, 15, True)  # 45 images: 36 train, 9 eval
model = create_model("resnet10t", data.num_classes)
module = trainable_module(model, unfreeze=False)
loader = DataLoader(data.eval, batch_size=4)
module, loader = accelerator.prepare(module, loader)
normalise = Normalise(model, accelerator.device, channels_last=False)
plain = loader_evaluate("plain")
metrics = loader_evaluate("metrics")
rank, world = accelerator.process_index, accelerator.num_processes
# 0 workers: a forkserver worker would run this script again (it has no main guard)
store = build_eval_store(data.eval, 4, rank, world, 0, accelerator.device)
stored = evaluate(module, store, accelerator, normalise)
if accelerator.is_main_process:
    result = {
        "eval_size": len(data.eval),
        "world": accelerator.num_processes,
        "plain": plain,
        "metrics": metrics,
        "store": stored,
        "store_shapes": sorted({tuple(images.shape) for images in store.images}),
    }
    print("RESULT " + json.dumps(result), flush=True)
accelerator.wait_for_everyone()
# The probe's result is printed; what follows is teardown. Rank 0 hosts the gloo group's TCP store, and
# even after end_training() it aborted once at exit in CI ("terminate called without an active
# exception", SIGABRT, after RESULT was printed: 2026-11-24). os._exit skips the C++ destructors where
# that race lives; this measures gather semantics, not teardown.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
