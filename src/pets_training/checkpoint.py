"""Checkpoints: ``accelerate`` ``save_state`` into a temp directory, then one rename.

Two kinds, one order: ``epoch_<N>`` after N whole epochs, and the step checkpoints of
``--checkpoint-interval-seconds``, ``epoch_<N>_step_<B>``: after N whole epochs and B steps of the next
(epoch N+1, counted from 1). Both name their position (:data:`Position`, ``(N, 0)`` and ``(N, B)``), which
sorts them without knowing the steps per epoch; "newest" and the pruning (keep the newest K, both kinds
together) use it.

A crash mid-save leaves only a temp directory, which is never picked up: a checkpoint exists only
when complete. Who writes depends on whether the machines share the checkpoint directory (the trainer
finds out at start with a probe file, :data:`SHARE_PROBE`):

- not shared (a directory per pod, or one machine): every machine keeps its own full copy
  (``save_on_each_node``): its main process writes the model, optimizer and scheduler, every process its
  ``random_states_<rank>.pkl``, and the machine's main process renames its temp directory;
- shared by every machine (one ReadWriteMany claim): one copy. Global rank 0 writes the model, optimizer
  and scheduler, every process its own ``random_states_<rank>.pkl`` into the same temp directory (named
  after rank 0's host), and rank 0 alone renames and prunes.

The fence: under the operator every attempt (a gang restart) has a number, ``$PETS_ATTEMPT``, that only
grows. Each node's main process claims the directory for its attempt (``claim``: the file ``attempt``)
before it starts and again before it publishes or prunes; a trainer whose directory holds a larger number
is superseded (:class:`SupersededError`) and stops without writing. No ``$PETS_ATTEMPT``: no fence.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pets_contract.env import ATTEMPT

from .contract import PermanentError

log = logging.getLogger("pets_training")

# epoch checkpoints and step checkpoints: epoch_<N> or epoch_<N>_step_<B>
POSITION_PATTERN = re.compile(r"^epoch_(\d+)(?:_step_(\d+))?$")
# (whole epochs done, steps done in the next epoch): epoch_3 is (3, 0), epoch_3_step_40 is (3, 40)
Position = tuple[int, int]
STATE_FILE = "trainer_state.json"
ATTEMPT_FILE = "attempt"  # in the checkpoint directory: the newest attempt that claimed it
# Written by rank 0 at start as SHARE_PROBE + a random token; every machine that sees it shares the directory.
SHARE_PROBE = ".share-probe-"


class SupersededError(PermanentError):
    """A newer attempt owns the checkpoint directory: this trainer stops without writing to it. Permanent
    (exit 78): no restart of this attempt can become the owner again."""


def read_attempt(directory: Path) -> int | None:
    """The attempt that owns ``directory``, or None when nobody claimed it (no ``attempt`` file)."""
    path = directory / ATTEMPT_FILE
    try:
        raw = path.read_text().strip()
    except FileNotFoundError:
        return None
    try:
        return int(raw)
    except ValueError:
        raise PermanentError(
            f"checkpoint fence {str(path)!r} holds {raw[:40]!r}, not an attempt number; remove it"
        ) from None


def claim(directory: Path, attempt: int) -> None:
    """Make ``directory`` owned by ``attempt``, or raise :class:`SupersededError` when a larger attempt owns
    it. Writes only when the file is missing or smaller (temp file + ``os.replace``, so readers see the old
    number or the new one). Read and replace are not one atomic step: two claims at the same moment could
    leave the smaller number, so the owner claims again before every publish and the file heals."""
    owner = read_attempt(directory)
    if owner is not None and owner > attempt:
        raise SupersededError(
            f"attempt {owner} owns {str(directory)!r} now; attempt {attempt} stops without writing "
            f"(the checkpoint fence: its {ATTEMPT_FILE} file holds {owner}, {ATTEMPT}={attempt})"
        )
    if owner == attempt:
        return
    directory.mkdir(parents=True, exist_ok=True)
    temp = directory / f".{ATTEMPT_FILE}-{socket.gethostname()}-{os.getpid()}.tmp"
    with open(temp, "w") as f:
        f.write(f"{attempt}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, directory / ATTEMPT_FILE)
    log.info("checkpoint fence: attempt %d claims %s (was %s)", attempt, directory,
             "unclaimed" if owner is None else f"attempt {owner}")


def checkpoint_name(epoch: int, step: int = 0) -> str:
    """``epoch_<N>`` after N epochs; ``epoch_<N>_step_<B>`` after N epochs and B steps of the next."""
    return f"epoch_{epoch}_step_{step}" if step else f"epoch_{epoch}"


def temp_name(epoch: int, host: str | None = None, step: int = 0) -> str:
    """The temp directory of a save, named after the publishing machine (default: this one)."""
    return f".tmp-{checkpoint_name(epoch, step)}-{host or socket.gethostname()}"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """Complete epoch checkpoints, oldest first."""
    return [(epochs, path) for (epochs, steps), path in list_positions(directory) if steps == 0]


def list_positions(directory: Path) -> list[tuple[Position, Path]]:
    """Complete checkpoints of both kinds (epoch and step), oldest first by position."""
    if not directory.is_dir():
        return []
    return sorted(((int(match.group(1)), int(match.group(2) or 0)), entry) for entry in directory.iterdir()
                  if (match := POSITION_PATTERN.match(entry.name)) and entry.is_dir())


def publish(temp: Path, final: Path) -> None:
    """Rename a finished temp checkpoint to its final name. Should machines that do not all share the
    directory still rename into one (some share it, some do not), the first wins and the others drop
    their copy. Checking for ``final`` before renaming would race, so the rename itself decides."""
    try:
        temp.rename(final)
    except OSError:
        if not (final / STATE_FILE).is_file():
            raise
        shutil.rmtree(temp)


def save_atomically(
    directory: Path,
    epoch: int,
    save_state: Callable[[str], Any],
    trainer_state: dict[str, Any],
    publishes: bool,
    wait_for_everyone: Callable[[], None],
    keep: int,
    attempt: int | None = None,
    host: str | None = None,
    step: int = 0,
) -> Path:
    """Every process calls this; ``save_state`` writes into the temp directory, the publishing process
    (``publishes``: each machine's main process, or global rank 0 alone when the machines share the
    directory) adds ``trainer_state.json`` and renames it to ``epoch_<N>``, then prunes old checkpoints.
    ``host`` names the temp directory: in a shared directory every process passes rank 0's host, so all
    write into one; None: this machine's.

    ``attempt`` (``$PETS_ATTEMPT``; None: no fence): right before the rename and again before pruning, the
    publishing process claims the directory; superseded by a newer attempt, it removes its temp directory
    and raises :class:`SupersededError` instead."""
    final = directory / checkpoint_name(epoch, step)
    temp = directory / temp_name(epoch, host, step)
    if publishes:
        directory.mkdir(parents=True, exist_ok=True)
        if temp.exists():
            shutil.rmtree(temp)  # left by a crash during an earlier save
    wait_for_everyone()
    save_state(str(temp))
    wait_for_everyone()
    if publishes:
        (temp / STATE_FILE).write_text(json.dumps(trainer_state, indent=1))
        if attempt is not None:
            try:
                claim(directory, attempt)
            except SupersededError:
                shutil.rmtree(temp, ignore_errors=True)
                raise
        publish(temp, final)
        if attempt is not None:
            claim(directory, attempt)
        for _, old in list_positions(directory)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    wait_for_everyone()
    return final


def read_trainer_state(checkpoint: Path) -> dict[str, Any]:
    path = checkpoint / STATE_FILE
    if not path.is_file():
        raise ValueError(
            f"checkpoint {str(checkpoint)!r} has no {STATE_FILE}; it was not written by pets-train"
        )
    state: dict[str, Any] = json.loads(path.read_text())
    return state


def check_compatible(saved: dict[str, Any], current: dict[str, Any], checkpoint: Path) -> None:
    """A checkpoint only resumes the run it came from: the settings that shape the state must match."""
    for key, value in current.items():
        if key in saved and saved[key] != value:
            raise PermanentError(
                f"resume: checkpoint {str(checkpoint)!r} was made with {key}={saved[key]!r}, this run has "
                f"{key}={value!r}; use another --checkpoint-dir or the same settings"
            )
