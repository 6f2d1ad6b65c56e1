"""Where the DataLoader workers come from, and what each runs at its start (``exit_with``).

A worker unpickles its ``worker_init_fn`` and its dataset, importing the modules that define them; this
one imports the standard library alone, and the datasets' modules (WORKER_PRELOAD) torch, torchvision,
numpy and PIL, never accelerate: a worker pays no import before its first batch that the forkserver has
not paid once for all (``test_inputs.py`` checks it).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import threading
import time
from pathlib import Path
from typing import Any

WORKER_CONTEXT = "forkserver"
# imported once by the forkserver; every worker forks with them: what the workers unpickle (the datasets
# of both input paths, the eval store's, and exit_with) comes from these modules
WORKER_PRELOAD = ("torch", "torch.utils.data", "pets_training.data", "pets_training.store",
                  "pets_training.device_input", "pets_training.workers")


def start_worker_server() -> None:
    """Start the forkserver the DataLoader workers fork from, with WORKER_PRELOAD imported in it. It is a
    new process (fork + exec), so no lock of this one reaches it; its imports overlap this one's setup."""
    context = multiprocessing.get_context(WORKER_CONTEXT)
    context.set_forkserver_preload(list(WORKER_PRELOAD))  # type: ignore[attr-defined]
    from multiprocessing import forkserver

    forkserver.ensure_running()


def worker_options(workers: int, pin: bool) -> dict[str, Any]:
    options: dict[str, Any] = {"num_workers": workers, "pin_memory": pin}
    if workers > 0:
        options["multiprocessing_context"] = WORKER_CONTEXT
        options["worker_init_fn"] = functools.partial(exit_with, os.getpid())
    return options


def exit_with(trainer: int, _worker_id: int) -> None:
    """In each worker: exit once the training process is gone, and not before. A worker is the forkserver's
    child, so torch's own watchdog (is my parent alive?) keeps it, and it the forkserver, alive after a
    SIGKILL. It leaves the rank's process group: torchrun sends SIGTERM to that group (os.killpg), and the
    rank, finishing its step and saving, still reads batches whose tensors the worker hands over. (Ignoring
    SIGTERM instead would hang the rank's exit: multiprocessing terminates daemonic workers, then joins.)"""
    os.setpgid(0, 0)

    def watch() -> None:
        while _running(trainer):
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="pets-exit-with-trainer", daemon=True).start()


def _running(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie does not (a killed trainer stays one while its launcher, which may be
    reading our inherited stdout, has not reaped it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: a zombie counts as running
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
