"""When to save a step checkpoint, and when to stop, decided the same way on every rank.

Every rank must call ``save_state`` at the same step (it holds barriers: a rank that saves alone waits
forever), so no rank decides from its own clock. After each step every rank contributes two flags,
(the save is due, a stop was requested), and they are combined with one all-reduce (MAX) of a two-element
tensor: the save flag is only ever set by rank 0, whose clock decides, and a stop asked of any rank stops
them all (:func:`agree` is the same rule as a pure function). One process: no collective. The flags are
the host's, so they travel on the host (gloo), never through the GPU: reading them back would wait for
the step the GPU is running.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


def agree(flags: Sequence[tuple[bool, bool]]) -> tuple[bool, bool]:
    """Every rank's (save due, stop requested), by rank -> what all do: rank 0's save, anyone's stop."""
    if not flags:
        raise ValueError("agree: no ranks")
    return bool(flags[0][0]), any(stop for _, stop in flags)


@dataclass
class SaveClock:
    """Rank 0's clock for ``--checkpoint-interval-seconds``: due once ``interval`` seconds have passed since
    the last save (or the start of this run). ``interval`` 0: never due."""

    interval: float
    last: float = 0.0

    def start(self, now: float | None = None) -> None:
        self.last = time.monotonic() if now is None else now

    def due(self, now: float | None = None) -> bool:
        if self.interval <= 0:
            return False
        return (time.monotonic() if now is None else now) - self.last >= self.interval


class StopRequest:
    """Set (from a signal handler or a test) to stop the training after its current step, with a step
    checkpoint. Reading and setting a bool is safe in a Python signal handler. ``stopped``: the training
    did stop for it (on every rank, also those that were not asked: they agree), rather than finish."""

    def __init__(self) -> None:
        self.requested = False
        self.reason = ""
        self.stopped = False
        # the global step the run reached: where it stopped, or where it failed (training_function sets it
        # on its way out); None: not known, it failed before its training loop began
        self.global_step: int | None = None
        self.checkpoint = ""  # the checkpoint it saved there ("": none, --no-checkpoints)
        self.time_seconds: dict[str, float] = {}  # this run's wall time by part (progress.TimeSplit)

    def set(self, reason: str) -> None:
        self.requested = True
        self.reason = reason

    def on_signal(self, signum: int, _frame: object) -> None:
        """A ``signal.signal`` handler: no logging here (the main thread may hold the log's lock)."""
        self.set(f"{signal.Signals(signum).name} received")


def decide(save_due: bool, stop: bool, is_main: bool, num_processes: int) -> tuple[bool, bool]:
    """What every rank does after this step, the same on all: ``(save, stop)`` by :func:`agree`'s rule.
    ``save_due`` counts on rank 0 only. Several processes: one all-reduce (MAX) of two small ints, on the
    host. Every rank calls it at the same points (its first call makes the host group, a collective)."""
    if num_processes == 1:
        return save_due, stop
    import torch.distributed as dist

    flags = torch.tensor([int(save_due and is_main), int(stop)], dtype=torch.int32)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=_host_group())
    save, stopping = flags.tolist()
    return bool(save), bool(stopping)


_HOST_GROUPS: dict[object, Any] = {}  # the default group -> a gloo group of every rank


def _host_group() -> Any:
    """None (the default group) where it is gloo already (CPU), else one gloo group of every rank, made
    once per default group."""
    import torch.distributed as dist

    if dist.get_backend() == dist.Backend.GLOO:
        return None
    world = dist.group.WORLD
    if world not in _HOST_GROUPS:
        _HOST_GROUPS[world] = dist.new_group(backend=dist.Backend.GLOO)
    return _HOST_GROUPS[world]
