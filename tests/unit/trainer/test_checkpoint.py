from pathlib import Path

import pytest

from pets_training.checkpoint import (
    check_compatible,
    list_checkpoints,
    publish,
    read_trainer_state,
    save_atomically,
    temp_name,
)

pytestmark = pytest.mark.unit


def _save(directory: Path, epoch: int, keep: int = 2) -> Path:
    def save_state(path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "model.safetensors").write_text(f"weights {epoch}")

    return save_atomically(directory, epoch, save_state, {"epoch": epoch}, True, lambda: None, keep)


def test_checkpoints_appear_complete_and_old_ones_are_pruned(tmp_path: Path) -> None:
    for epoch in (1, 2, 3):
        _save(tmp_path, epoch)
    assert [e for e, _ in list_checkpoints(tmp_path)] == [2, 3]
    epoch, path = list_checkpoints(tmp_path)[-1]
    assert epoch == 3 and (path / "model.safetensors").read_text() == "weights 3"
    assert read_trainer_state(path) == {"epoch": 3}
    assert not any(p.name.startswith(".tmp") for p in tmp_path.iterdir())


def test_in_a_shared_directory_the_first_machine_to_rename_wins(tmp_path: Path) -> None:
    # Two machines that do not know they share the directory (not every machine does) finish epoch 1 at
    # the same moment; machine A's rename has already landed.
    winner = _save(tmp_path, 1)
    late = tmp_path / temp_name(1).replace("epoch_1", "epoch_1-other")
    late.mkdir()
    (late / "model.safetensors").write_text("weights of the other machine")
    publish(late, winner)
    assert not late.exists()
    assert (winner / "model.safetensors").read_text() == "weights 1"


def test_a_failed_rename_without_a_complete_winner_is_an_error(tmp_path: Path) -> None:
    final = tmp_path / "epoch_1"
    (final / "junk").mkdir(parents=True)  # not a checkpoint: no trainer state
    temp = tmp_path / temp_name(1)
    temp.mkdir()
    (temp / "model.safetensors").write_text("weights")
    with pytest.raises(OSError):
        publish(temp, final)
    assert temp.exists()


def test_a_crash_mid_save_leaves_nothing_that_resume_would_pick(tmp_path: Path) -> None:
    _save(tmp_path, 1)

    def crashing_save(path: str) -> None:
        Path(path).mkdir(parents=True)
        (Path(path) / "model.safetensors").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_atomically(tmp_path, 2, crashing_save, {}, True, lambda: None, 2)
    assert (tmp_path / temp_name(2)).exists()
    assert list_checkpoints(tmp_path) == [(1, tmp_path / "epoch_1")]
    _save(tmp_path, 2)  # the next save clears the leftover
    assert list_checkpoints(tmp_path)[-1] == (2, tmp_path / "epoch_2")


def test_no_directory_means_no_checkpoint(tmp_path: Path) -> None:
    assert list_checkpoints(tmp_path / "none") == []


def test_mismatched_settings_refuse_to_resume(tmp_path: Path) -> None:
    check_compatible({"epochs": 5}, {"epochs": 5, "lr": 0.1}, tmp_path)
    with pytest.raises(ValueError, match="was made with epochs=5, this run has epochs=3"):
        check_compatible({"epochs": 5}, {"epochs": 3}, tmp_path)
    (tmp_path / "epoch_1").mkdir()
    with pytest.raises(ValueError, match="has no trainer_state.json"):
        read_trainer_state(tmp_path / "epoch_1")
