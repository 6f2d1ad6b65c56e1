"""Per-epoch checkpoints: ``accelerate`` ``save_state`` into a temp directory, then one rename.

A crash mid-save leaves only a temp directory, which is never picked up: ``epoch_<N>`` exists only
when complete. Every machine keeps its own copy (``save_on_each_node``), so a checkpoint directory per
pod works; a shared one works too (each machine renames its own temp directory; the first wins).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .contract import PermanentError

CHECKPOINT_PATTERN = re.compile(r"^epoch_(\d+)$")
STATE_FILE = "trainer_state.json"


def checkpoint_name(epoch: int) -> str:
    return f"epoch_{epoch}"


def temp_name(epoch: int) -> str:
    return f".tmp-epoch_{epoch}-{socket.gethostname()}"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first."""
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        match = CHECKPOINT_PATTERN.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def publish(temp: Path, final: Path) -> None:
    """Rename a finished temp checkpoint to its final name. In a directory shared by several machines
    they all rename at the same moment: the first wins and the others drop their copy. Checking for
    ``final`` before renaming would race, so the rename itself decides."""
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
    is_node_main: bool,
    wait_for_everyone: Callable[[], None],
    keep: int,
) -> Path:
    """Every process calls this; ``save_state`` writes into the temp directory, the node's main process
    adds ``trainer_state.json`` and renames it to ``epoch_<N>``, then prunes old checkpoints."""
    final = directory / checkpoint_name(epoch)
    temp = directory / temp_name(epoch)
    if is_node_main:
        directory.mkdir(parents=True, exist_ok=True)
        if temp.exists():
            shutil.rmtree(temp)  # left by a crash during an earlier save
    wait_for_everyone()
    save_state(str(temp))
    wait_for_everyone()
    if is_node_main:
        (temp / STATE_FILE).write_text(json.dumps(trainer_state, indent=1))
        publish(temp, final)
        for _, old in list_checkpoints(directory)[:-keep]:
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
