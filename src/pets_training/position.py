"""Where a training is in an epoch, whatever its world size: the global order, the global batch and the
schedule, as pure functions (docs/operator.md, "Resizing a training").

An epoch's order is one permutation of its ``n`` training samples, a function of (seed, epoch)
(:class:`.data.EpochShuffleSampler`). It is cut into chunks of ``batch_size`` (the last one may be short),
and the chunks into optimizer steps of ``global_batch // batch_size`` chunks each: step ``k`` trains
permutation positions ``[k * global_batch, (k + 1) * global_batch)``, at every world size. At world size
``W`` each step is ``accumulation = global_batch // (batch_size * W)`` micro-steps; in micro-step ``j``,
rank ``r`` trains chunk ``k * chunks_per_step + j * W + r``. So the ranks of a step train exactly its
chunks, each once, and a run that stops after step ``k`` has done the first ``min((k + 1) * global_batch,
n)`` samples of the permutation, which any world size continues from the next one.

Padding: in the epoch's last step a rank may have no chunk left. It then trains the permutation's first
chunk once with loss weight 0 (:attr:`MicroStep.padding`), so that every rank takes part in DDP's
all-reduce; it adds nothing to the gradient, the loss or the sample counts. Rank 0 always has a real chunk.
The loss of a micro-step is the sum over its samples x ``W / R`` (:func:`loss_weight`), ``R`` the real
samples of its step, so that DDP's mean over ranks is the mean over the step's samples at any ``W``.

The learning-rate schedule counts chunks: after the step that ends at sample ``s`` of epoch ``e`` it is
at ``e * ceil(n / batch_size) + ceil(s / batch_size)`` (:func:`schedule_position`), the same at any size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .contract import PermanentError


class ResizeError(PermanentError):
    """A world size that cannot keep the training's global batch; the message names the sizes."""


@dataclass(frozen=True)
class Layout:
    """How one epoch is trained at one world size."""

    samples: int  # n: the epoch's training samples
    batch_size: int  # one process's micro-batch
    global_batch: int  # samples of one optimizer step, every process and micro-step together
    world_size: int

    @property
    def chunks_per_step(self) -> int:
        return self.global_batch // self.batch_size

    @property
    def accumulation(self) -> int:
        """Micro-steps per optimizer step (gradient accumulation)."""
        return self.global_batch // (self.batch_size * self.world_size)

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps of an epoch: the same at every world size."""
        return math.ceil(self.samples / self.global_batch)

    @property
    def chunks_per_epoch(self) -> int:
        """The schedule's units in an epoch."""
        return math.ceil(self.samples / self.batch_size)


def world_sizes(global_batch: int, batch_size: int) -> list[int]:
    """The world sizes that keep ``global_batch`` with micro-batches of ``batch_size``."""
    chunks = global_batch // batch_size
    return [w for w in range(1, chunks + 1) if chunks % w == 0]


def layout(samples: int, batch_size: int, global_batch: int, world_size: int, where: str = "") -> Layout:
    """The epoch's layout, or :class:`ResizeError` when ``world_size`` processes of ``batch_size`` cannot make
    ``global_batch`` by accumulation. ``where``: where the global batch came from (for the error)."""
    for name, value in (("samples", samples), ("batch_size", batch_size), ("world_size", world_size)):
        if value < 1:
            raise ValueError(f"layout: {name} must be at least 1, got {value}")
    if global_batch < 1 or global_batch % batch_size:
        raise ResizeError(
            f"global_batch_size {global_batch}{where} must be a positive multiple of batch_size {batch_size}"
        )
    if global_batch % (batch_size * world_size):
        raise ResizeError(
            f"global_batch_size {global_batch}{where} cannot be kept at world size {world_size}: it is not a "
            f"multiple of batch_size {batch_size} x {world_size} processes. World sizes that keep it: "
            f"{', '.join(map(str, world_sizes(global_batch, batch_size)))} (replicas x processesPerReplica)"
        )
    return Layout(samples, batch_size, global_batch, world_size)


@dataclass(frozen=True)
class MicroStep:
    """One forward and backward of one rank: permutation positions ``[start, end)``."""

    step: int  # the optimizer step of the epoch it belongs to, from 0
    start: int
    end: int
    last: bool  # this rank's last micro-step of the step: its backward all-reduces, then the step
    padding: bool = False  # loss weight 0: only here so that this rank takes part in the all-reduce

    @property
    def size(self) -> int:
        return self.end - self.start


def step_samples(lay: Layout, step: int) -> int:
    """Real samples of optimizer step ``step`` (every rank together)."""
    return max(0, min(lay.global_batch, lay.samples - step * lay.global_batch))


def samples_done(lay: Layout, steps: int) -> int:
    """Samples of the epoch's permutation done after ``steps`` optimizer steps."""
    return min(steps * lay.global_batch, lay.samples)


def steps_done(lay: Layout, samples: int, where: str = "") -> int:
    """The optimizer steps that did the first ``samples`` samples; a position inside a step is refused."""
    if samples == lay.samples:
        return lay.steps_per_epoch
    if not 0 <= samples < lay.samples or samples % lay.global_batch:
        raise ResizeError(
            f"position{where}: {samples} samples done is not the end of an optimizer step of "
            f"global_batch_size {lay.global_batch} in an epoch of {lay.samples} samples"
        )
    return samples // lay.global_batch


def rank_plan(lay: Layout, rank: int, start_step: int = 0) -> list[MicroStep]:
    """Rank ``rank``'s micro-steps of the epoch from optimizer step ``start_step`` on, in order."""
    if not 0 <= rank < lay.world_size:
        raise ValueError(f"rank_plan: rank {rank} is not in 0..{lay.world_size - 1}")
    plan: list[MicroStep] = []
    b, n = lay.batch_size, lay.samples
    for step in range(start_step, lay.steps_per_epoch):
        first = step * lay.chunks_per_step + rank
        chunks = [first + j * lay.world_size for j in range(lay.accumulation)]
        real = [c for c in chunks if c * b < n]
        if not real:
            plan.append(MicroStep(step, 0, min(b, n), last=True, padding=True))
            continue
        plan += [MicroStep(step, c * b, min((c + 1) * b, n), last=c == real[-1]) for c in real]
    return plan


def loss_weight(lay: Layout, micro: MicroStep) -> float:
    """What a micro-step's summed loss is multiplied by: ``W / R`` (0 for padding), so that DDP's mean of the
    ranks' gradients is the gradient of the mean loss over the step's ``R`` samples."""
    return 0.0 if micro.padding else lay.world_size / step_samples(lay, micro.step)


def schedule_position(lay: Layout, epoch: int, samples: int) -> int:
    """The learning-rate schedule's step after ``samples`` samples of epoch index ``epoch``."""
    return epoch * lay.chunks_per_epoch + math.ceil(samples / lay.batch_size)


def schedule_total(lay: Layout, epochs: int) -> int:
    """The schedule's length (OneCycleLR's ``total_steps``) for ``epochs`` epochs."""
    return epochs * lay.chunks_per_epoch
