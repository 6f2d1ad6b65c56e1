"""The checkpoint fence (docs/trainer.md, "Checkpoint fence"): ``$PETS_ATTEMPT`` and the ``attempt`` file.
A trainer of an older attempt never publishes into, or prunes, a checkpoint directory a newer attempt owns."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from pets_contract import exits
from pets_contract.env import ATTEMPT, EXIT_CODE_FILE
from pets_training import checkpoint, contract
from pets_training.checkpoint import (
    ATTEMPT_FILE,
    SupersededError,
    claim,
    list_checkpoints,
    read_attempt,
    read_trainer_state,
    save_atomically,
)

from .helpers import BIN, PYTHON, read_json, run

pytestmark = pytest.mark.unit


def _save(
    directory: Path, epoch: int, attempt: int | None, keep: int = 2, during: Callable[[], None] | None = None
) -> Path:
    def save_state(path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "model.safetensors").write_text(f"weights {epoch}")
        if during is not None:
            during()

    return save_atomically(directory, epoch, save_state, {"epoch": epoch}, True, lambda: None, keep, attempt)


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_the_attempt_comes_from_the_env_and_is_optional() -> None:
    assert contract.attempt_number({}) is None
    assert contract.attempt_number({ATTEMPT: " "}) is None
    assert contract.attempt_number({ATTEMPT: "0"}) == 0
    assert contract.attempt_number({ATTEMPT: "3"}) == 3
    for bad in ("two", "-1"):
        with pytest.raises(contract.ContractError, match=f"{ATTEMPT} must"):
            contract.attempt_number({ATTEMPT: bad})


def test_claim_writes_the_attempt_and_only_a_larger_one_replaces_it(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoints"
    assert read_attempt(directory) is None  # nobody claimed it (older directories: no file)
    claim(directory, 2)
    assert (directory / ATTEMPT_FILE).read_text() == "2\n"
    claim(directory, 2)  # the same attempt (another machine of the gang, a second save): no change
    claim(directory, 3)
    assert read_attempt(directory) == 3
    with pytest.raises(SupersededError, match=r"attempt 3 owns .* now; attempt 2 stops without writing"):
        claim(directory, 2)
    assert read_attempt(directory) == 3
    assert _names(directory) == [ATTEMPT_FILE]  # no temp files left
    assert issubclass(SupersededError, contract.PermanentError)  # exit 78


def test_an_unreadable_attempt_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / ATTEMPT_FILE).write_text("garbage")
    with pytest.raises(contract.PermanentError, match="not an attempt number"):
        claim(tmp_path, 1)


def test_the_attempt_file_is_not_a_checkpoint(tmp_path: Path) -> None:
    _save(tmp_path, 1, attempt=0)
    assert read_attempt(tmp_path) == 0
    assert list_checkpoints(tmp_path) == [(1, tmp_path / "epoch_1")]


def test_publish_is_refused_once_a_newer_attempt_claims_the_directory(tmp_path: Path) -> None:
    for epoch in (1, 2):
        _save(tmp_path, epoch, attempt=2)
    # the newer attempt claims while attempt 2 is still writing epoch 3 (it had passed the last barrier)
    with pytest.raises(SupersededError, match="attempt 3 owns"):
        _save(tmp_path, 3, attempt=2, during=lambda: claim(tmp_path, 3))
    assert _names(tmp_path) == [ATTEMPT_FILE, "epoch_1", "epoch_2"]  # no epoch_3, no temp, nothing pruned
    assert read_attempt(tmp_path) == 3


def test_prune_is_refused_once_a_newer_attempt_claims_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for epoch in (1, 2):
        _save(tmp_path, epoch, attempt=2)
    real_publish = checkpoint.publish

    def publish_then_newer_claim(temp: Path, final: Path) -> None:
        real_publish(temp, final)
        claim(tmp_path, 3)

    monkeypatch.setattr(checkpoint, "publish", publish_then_newer_claim)
    with pytest.raises(SupersededError):
        _save(tmp_path, 3, attempt=2)
    assert [e for e, _ in list_checkpoints(tmp_path)] == [1, 2, 3]  # epoch_1 not pruned by attempt 2


def test_the_owner_reclaims_a_smaller_number_before_publishing(tmp_path: Path) -> None:
    claim(tmp_path, 1)  # e.g. a stale claim that raced with ours and landed last
    _save(tmp_path, 1, attempt=2)
    assert read_attempt(tmp_path) == 2


def test_no_attempt_means_no_fence(tmp_path: Path) -> None:
    claim(tmp_path, 9)
    for epoch in (1, 2, 3):
        _save(tmp_path, epoch, attempt=None)
    assert [e for e, _ in list_checkpoints(tmp_path)] == [2, 3]
    assert read_attempt(tmp_path) == 9  # neither checked nor written


# the smallest settings that get through setup quickly (as in test_exit_codes)
TINY = {
    "model": "resnet10t",
    "image_size": 32,
    "synthetic_classes": 2,
    "synthetic_images_per_class": 8,  # 12 for training -> 3 steps per epoch
    "batch_size": 4,
    "eval_batch_size": 8,
    "mixed_precision": "no",
    "num_workers": 0,
    "threads": 1,
    "pretrained": False,  # no internet here
}


def _env(attempt: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != EXIT_CODE_FILE}
    return {**env, ATTEMPT: attempt}


@pytest.mark.timeout(120)
def test_a_stale_trainer_exits_78_at_start_without_writing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    claim(out / "checkpoints", 4)
    args = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items() if k != "pretrained"]
    proc = subprocess.run(
        [str(BIN / "pets-train"), *args, "--no-pretrained", "--epochs=1", "--resume",
         "--output-dir", str(out), "--summary-path", str(tmp_path / "termination-log")],
        env=_env("3"), capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert proc.returncode == exits.PERMANENT, proc.stderr[-3000:]
    error = read_json(tmp_path / "termination-log")["error"]
    assert "attempt 4 owns" in error and "attempt 3 stops without writing" in error
    assert _names(out) == ["checkpoints"]  # no config.yaml, progress or summary.json: attempt 4's directory
    assert _names(out / "checkpoints") == [ATTEMPT_FILE] and read_attempt(out / "checkpoints") == 4


# Trains in a child process (a fresh accelerate state); at the first step of epoch 2 a newer attempt claims
# the checkpoint directory, so epoch 2's save is refused.
NEWER_CLAIM = """
import json, sys
from pathlib import Path
from pets_training.checkpoint import SupersededError, claim
from pets_training.train import training_function

settings = json.loads(sys.argv[1])

def hook(step, images):
    if step == 4:
        claim(Path(settings["output_dir"]) / "checkpoints", 2)

try:
    training_function(settings, step_hook=hook)
except SupersededError as err:
    print("SUPERSEDED " + str(err))
"""


@pytest.mark.timeout(150)
def test_the_trainer_claims_at_start_and_its_save_stops_once_superseded(tmp_path: Path) -> None:
    settings = {**TINY, "epochs": 2, "output_dir": str(tmp_path)}
    output, _ = run([PYTHON, "-c", NEWER_CLAIM, json.dumps(settings)], timeout=140, env=_env("1"))
    assert "SUPERSEDED attempt 2 owns" in output and "attempt 1 stops without writing" in output
    directory = tmp_path / "checkpoints"
    assert _names(directory) == [ATTEMPT_FILE, "epoch_1"]  # epoch 2 never published, its temp removed
    assert read_trainer_state(directory / "epoch_1")["attempt"] == 1
    assert read_attempt(directory) == 2
