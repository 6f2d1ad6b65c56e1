"""Which checkpoint a run may continue from, by its format (saves.checkpoint_fits), where it continues
(saves.resumed_position), and the global batch it keeps (saves.start_layout): pure rules, no training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from pets_training.config import resolve
from pets_training.contract import PermanentError
from pets_training.position import ResizeError
from pets_training.saves import checkpoint_fits, decode_counts, encode_counts, resumed_position, start_layout

pytestmark = pytest.mark.unit

FORMAT_1_STEP: dict[str, Any] = {  # v0.1.0's step checkpoint: 2 processes, batch 4, 32 samples
    "position": {"epoch": 1, "steps": 3, "global_step": 7, "steps_per_epoch": 4, "world_size": 2},
}
FORMAT_2_STEP: dict[str, Any] = {
    "format": 2, "global_batch": 8,
    "position": {"epoch": 1, "steps": 3, "samples": 24, "epoch_samples": 32, "global_step": 7,
                 "world_size": 2, "accumulation": 1},
}  # fmt: skip


def test_a_format_1_step_checkpoint_fits_only_its_own_world_size_and_steps() -> None:
    assert checkpoint_fits(FORMAT_1_STEP, True, 2, 32, 4) == ""
    assert checkpoint_fits(FORMAT_1_STEP, True, 1, 32, 4) == (
        "format 1 (v0.1.0: its position counts steps of its own world size) was made with world_size=2, "
        "this run has world_size=1")
    other_epoch = checkpoint_fits(FORMAT_1_STEP, True, 2, 40, 4)
    assert "steps_per_epoch=4, this run has steps_per_epoch=5" in other_epoch
    assert resumed_position(FORMAT_1_STEP, 4, 32) == (8, 24)
    assert resumed_position({**FORMAT_1_STEP, "position": {**FORMAT_1_STEP["position"], "steps": 4}}, 4, 30) \
        == (8, 30)  # the last step of an epoch of 30: capped at the epoch
    assert checkpoint_fits({}, False, 3, 32, 4) == "" and resumed_position({}, 4, 32) == (None, 0)


def test_a_format_2_checkpoint_fits_any_world_size_of_an_epoch_of_as_many_samples() -> None:
    for world in (1, 2, 4, 3):  # 3 fits here; the global batch refuses it (start_layout)
        assert checkpoint_fits(FORMAT_2_STEP, True, world, 32, 4) == ""
    assert checkpoint_fits(FORMAT_2_STEP, True, 2, 33, 4) == "its epoch has 32 samples, this run's has 33"
    assert resumed_position(FORMAT_2_STEP, 4, 32) == (8, 24)
    assert resumed_position({"format": 2, "global_batch": 8}, 4, 32) == (8, 0)  # an epoch checkpoint
    assert checkpoint_fits({"format": 3}, False, 1, 32, 4) == (
        "format 3 is not one this trainer reads (1 to 2): a newer trainer wrote it")


def test_the_global_batch_is_the_recorded_one_else_the_flag_else_the_first_size() -> None:
    cfg = resolve(["--batch-size", "4"])
    assert start_layout(cfg, 32, 2).global_batch == 8
    assert start_layout(cfg, 32, 1, 8, Path("ck")).accumulation == 2
    flagged = resolve(["--batch-size", "4", "--global-batch-size", "16"])
    assert start_layout(flagged, 32, 2).accumulation == 2
    with pytest.raises(ResizeError, match=r"global_batch_size 8 \(recorded in ck\) cannot be kept at world "
                       r"size 3: .* World sizes that keep it: 1, 2 "):
        start_layout(cfg, 32, 3, 8, Path("ck"))
    with pytest.raises(PermanentError, match="--global-batch-size \\(global_batch_size\\) 16 differs from 8, "
                       "recorded in checkpoint 'ck' when the training first started"):
        start_layout(flagged, 32, 2, 8, Path("ck"))
    with pytest.raises(ResizeError, match=r"global_batch_size 6 \(--global-batch-size\) must be a positive "):
        start_layout(resolve(["--batch-size", "4", "--global-batch-size", "6"]), 32, 1)


def test_the_sample_counts_travel_in_the_checkpoint() -> None:
    counts = torch.tensor([0, 1, 2, 300], dtype=torch.int32)
    assert decode_counts(encode_counts(counts), 4).tolist() == [0, 1, 2, 255]  # type: ignore[union-attr]
    assert decode_counts(encode_counts(counts), 5) is None and decode_counts(None, 4) is None
