"""Run by test_shared_checkpoints.py under ``accelerate launch``, one process per machine (not a test module).

Trains through ``training_function`` with ``json.loads(argv[1])`` as its settings and prints, each line
prefixed with this process's rank, what the checkpoints involve:

- ``WRITE <rank> <file name>`` for every file accelerate's ``save_state`` writes in this process;
- ``RENAME <rank> <from> <to>`` for every rename in the checkpoint directory (``epoch_<N>`` publishes);
- ``RNG <rank> saved|loaded <digest>``: this process's torch RNG state when it saves, and right after a
  resume has loaded its ``random_states_<rank>.pkl``.

At the first step each rank reseeds its torch RNG with 1000 + rank, so every rank's state differs and a
rank that loaded another's file (or none) shows up.
"""

import hashlib
import json
import os
import sys
from pathlib import Path

import accelerate.utils.other
import torch
from accelerate import Accelerator, PartialState

from pets_training.train import training_function

settings = json.loads(sys.argv[1])
RANK = int(os.environ["RANK"])


def say(*words: object) -> None:
    print(*words, flush=True)


def digest() -> str:
    return hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()[:16]


real_torch_save, real_safe_save = torch.save, accelerate.utils.other.safe_save_file


def torch_save(obj, f, *args, **kwargs):  # type: ignore[no-untyped-def]
    if isinstance(f, str | os.PathLike):
        say("WRITE", RANK, Path(f).name)
    return real_torch_save(obj, f, *args, **kwargs)


def safe_save(tensors, filename, *args, **kwargs):  # type: ignore[no-untyped-def]
    say("WRITE", RANK, Path(filename).name)
    return real_safe_save(tensors, filename, *args, **kwargs)


torch.save, accelerate.utils.other.safe_save_file = torch_save, safe_save


def audit(event: str, args: tuple) -> None:  # type: ignore[type-arg]
    if event == "os.rename" and "epoch_" in str(args[1]):
        say("RENAME", RANK, Path(args[0]).name, Path(args[1]).name)


sys.addaudithook(audit)
real_save_state, real_load_state = Accelerator.save_state, Accelerator.load_state


def save_state(self, *args, **kwargs):  # type: ignore[no-untyped-def]
    say("RNG", RANK, "saved", digest())
    return real_save_state(self, *args, **kwargs)


def load_state(self, *args, **kwargs):  # type: ignore[no-untyped-def]
    result = real_load_state(self, *args, **kwargs)
    say("RNG", RANK, "loaded", digest())
    return result


Accelerator.save_state, Accelerator.load_state = save_state, load_state  # type: ignore[method-assign]


def hook(step: int, images: int) -> None:
    if step == 1:
        torch.manual_seed(1000 + PartialState().process_index)


training_function(settings, step_hook=hook)
