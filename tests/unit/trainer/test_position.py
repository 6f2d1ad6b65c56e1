"""The global position of a training in an epoch (position.py): resharded from world size W to W' it
continues the same permutation from the next sample, each sample once; the global batch is kept by
accumulation or refused; and the learning rate at a sample is the same before and after a resize."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch

from pets_training.data import EpochShuffleSampler
from pets_training.position import (
    Layout,
    ResizeError,
    layout,
    loss_weight,
    rank_plan,
    samples_done,
    schedule_position,
    schedule_total,
    step_samples,
    steps_done,
    world_sizes,
)

pytestmark = pytest.mark.unit


def _trained(
    sampler: EpochShuffleSampler, lay: Layout, start_step: int, end_step: int | None = None
) -> list[int]:
    """Every rank's real samples (their keys, through the sampler) of the steps from ``start_step`` to
    ``end_step`` (None: the epoch's end), all ranks."""
    keys: list[int] = []
    for rank in range(lay.world_size):
        plan = rank_plan(lay, rank, start_step)
        sampler.set_plan(plan)
        mine = list(sampler)
        assert len(mine) == len(sampler)
        at = 0
        for micro in plan:  # the sampler yields the plan's micro-steps in turn
            if not micro.padding and (end_step is None or micro.step < end_step):
                keys += mine[at:at + micro.size]
            at += micro.size
    return keys


# (n, batch_size, global batch in chunks, W before, W after): short last chunks, short last steps, steps
# with fewer chunks than ranks, growth and shrinkage
CASES = [
    (37, 4, 4, 4, 1), (37, 4, 4, 1, 4), (37, 4, 4, 2, 4), (40, 4, 2, 2, 1), (41, 4, 2, 1, 2),
    (101, 8, 6, 6, 2), (101, 8, 6, 3, 1), (101, 8, 6, 2, 3), (9, 4, 4, 4, 2), (64, 16, 2, 2, 1),
]


@pytest.mark.parametrize(("n", "b", "chunks", "before", "after"), CASES)
def test_a_resharded_epoch_continues_the_permutation_each_sample_once(
    n: int, b: int, chunks: int, before: int, after: int
) -> None:
    sampler = EpochShuffleSampler(n, seed=7)
    sampler.set_epoch(3)
    order = (sampler.order() + 3 * n).tolist()
    first, second = layout(n, b, b * chunks, before), layout(n, b, b * chunks, after)
    assert first.steps_per_epoch == second.steps_per_epoch
    for stop in range(first.steps_per_epoch + 1):  # stopped after `stop` steps at W, resumed at W'
        done = samples_done(first, stop)
        before_resize = _trained(sampler, first, 0, stop)
        after_resize = _trained(sampler, second, steps_done(second, done))
        assert sorted(before_resize, key=order.index) == order[:done]
        assert Counter(before_resize + after_resize) == Counter(order), (stop, done)  # each sample once


def test_each_step_trains_its_own_samples_at_any_world_size() -> None:
    n, b, chunks = 101, 8, 6
    for w in world_sizes(b * chunks, b):
        lay = layout(n, b, b * chunks, w)
        for step in range(lay.steps_per_epoch):
            micro = [m for r in range(w) for m in rank_plan(lay, r) if m.step == step and not m.padding]
            positions = sorted(p for m in micro for p in range(m.start, m.end))
            assert positions == list(range(step * b * chunks, step * b * chunks + step_samples(lay, step)))
        for r in range(w):
            plan = rank_plan(lay, r)
            assert [m.step for m in plan if m.last] == list(range(lay.steps_per_epoch)), (w, r)  # one sync
            assert not plan[0].padding and (r > 0 or not any(m.padding for m in plan))


def test_the_loss_weights_make_the_step_mean_over_its_real_samples() -> None:
    n, b = 37, 4
    for w in (1, 2, 4):
        lay = layout(n, b, 16, w)
        for step in range(lay.steps_per_epoch):
            micro = [m for r in range(w) for m in rank_plan(lay, r) if m.step == step]
            # DDP averages over ranks: sum of size x weight / W == 1 means the mean over the real samples
            assert sum(m.size * loss_weight(lay, m) for m in micro) / w == pytest.approx(1.0)
            assert all(loss_weight(lay, m) == 0 for m in micro if m.padding)


def test_a_world_size_that_cannot_keep_the_global_batch_is_refused_with_the_sizes() -> None:
    assert layout(100, 16, 32, 1).accumulation == 2 and layout(100, 16, 32, 2).accumulation == 1
    assert world_sizes(64, 16) == [1, 2, 4]
    refused = (r"global_batch_size 32 \(from x\) cannot be kept at world size 3: it is not a multiple of "
               r"batch_size 16 x 3 processes. World sizes that keep it: 1, 2")
    with pytest.raises(ResizeError, match=refused):
        layout(100, 16, 32, 3, " (from x)")
    with pytest.raises(ResizeError, match="global_batch_size 32 cannot be kept at world size 4"):
        layout(100, 16, 32, 4)
    with pytest.raises(ResizeError, match="global_batch_size 24 must be a positive multiple of batch_size"):
        layout(100, 16, 24, 1)
    with pytest.raises(ResizeError, match="17 samples done is not the end of an optimizer step"):
        steps_done(layout(100, 16, 32, 1), 17)
    with pytest.raises(ValueError, match="world_size must be at least 1, got 0"):
        layout(100, 16, 32, 0)


def _lrs(steps: list[tuple[int, int]], lay: Layout, epochs: int,
         state: dict[str, object] | None = None) -> tuple[list[float], dict[str, object]]:
    """The learning rate after each (epoch, step) of a OneCycleLR set by schedule_position, as the trainer
    does; ``state``: the scheduler's state_dict of a checkpoint to continue from."""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([param], lr=3e-2 / 25)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-2,
                                                    total_steps=schedule_total(lay, epochs))
    if state is not None:
        scheduler.load_state_dict(state)
    lrs = []
    for epoch, step in steps:
        optimizer.step()
        scheduler.last_epoch = schedule_position(lay, epoch, samples_done(lay, step + 1)) - 1
        scheduler.step()
        lrs.append(optimizer.param_groups[0]["lr"])
    return lrs, scheduler.state_dict()


def test_the_schedule_at_a_sample_is_the_same_before_and_after_a_resize() -> None:
    n, b, global_batch, epochs = 37, 4, 16, 3
    unresized = layout(n, b, global_batch, 4)
    steps = [(e, s) for e in range(epochs) for s in range(unresized.steps_per_epoch)]
    expected, _ = _lrs(steps, unresized, epochs)
    for before, after in itertools.permutations((1, 2, 4), 2):
        cut = 4  # a resize after 4 optimizer steps (epoch 2, step 1)
        first, state = _lrs(steps[:cut], layout(n, b, global_batch, before), epochs)
        second, _ = _lrs(steps[cut:], layout(n, b, global_batch, after), epochs, state)
        assert first + second == expected, (before, after)
    assert schedule_position(unresized, 1, 37) == 2 * 10 and schedule_total(unresized, 3) == 30
