"""Shared bits of the trainer tests: the small recipe, running real commands, free ports."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# An easy synthetic set and a small model: the recipe's code paths at a size this 2-core machine
# trains in seconds (resnet10t at 64 px, 4 classes x 80 images, 3 epochs).
SMALL_ARGS = [
    "--model", "resnet10t",
    "--image-size", "64",
    "--synthetic-classes", "4",
    "--synthetic-images-per-class", "80",
    "--epochs", "3",
    "--batch-size", "16",
    "--eval-batch-size", "32",
    "--mixed-precision", "bf16",
    "--log-every", "5",
    "--no-pretrained",  # no internet here: random init
]  # fmt: skip

PYTHON = sys.executable
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def closed_port() -> int:
    """A port nothing listens on (bound, then closed): a connection to it is refused at once."""
    return free_port()


class Tripwire:
    """A listening socket that records whether anything connected to it: point HF_ENDPOINT here to prove
    that no network call was made."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.setblocking(False)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def connections(self) -> int:
        count = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1

    def close(self) -> None:
        self.sock.close()


def run(
    cmd: list[str], timeout: float, env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[str, float]:
    """Run a real command; fail loudly with its output when it does not exit 0. Returns (output, seconds)."""
    start = time.monotonic()
    proc = subprocess.run(
        cmd, env={**os.environ, **(env or {})}, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    seconds = time.monotonic() - start
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{output[-6000:]}"
    return output, seconds


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def train_variants(tmp_path: Path, variants: dict[str, list[str]]) -> dict[str, str]:
    """The small recipe on a small set of JPEG files, 2 epochs, once per variant (its extra flags), each
    into ``tmp_path / name``; returns each run's output."""
    from pets_training.synthetic import write_synthetic

    images = tmp_path / "images"
    write_synthetic(images, 4, 40, 72, seed=3)
    args = [*SMALL_ARGS, "--data", str(images), "--epochs", "2", "--threads", "1", "--num-workers", "1",
            "--no-checkpoints"]
    return {name: run([PYTHON, "-m", "pets_training", *args, *extra, "--output-dir", str(tmp_path / name)],
                      timeout=140)[0] for name, extra in variants.items()}


# The device path's batched resize (crops.resize_boxes) against the CPU path's torchvision resize of the
# same boxes, in levels of 255: at most this far apart, and this far on average.
CROP_MAX_LEVELS = 2
CROP_MEAN_LEVELS = 0.05


def assert_crops_close(got: Any, expected: Any) -> None:
    """Two uint8 batches of crops within the device path's tolerance of each other."""
    diff = (got.int() - expected.int()).abs()
    assert got.shape == expected.shape and got.dtype == expected.dtype
    worst, mean = int(diff.max()), float(diff.float().mean())
    assert worst <= CROP_MAX_LEVELS and mean <= CROP_MEAN_LEVELS, f"max {worst}, mean {mean:.4f} levels"


def assert_same_progress(first: Path, second: Path, loss: float = 0.0, accuracy: float = 0.0) -> None:
    """Two runs' progress.jsonl: epoch for epoch the same train loss (within ``loss``, relative) and eval
    accuracy (within ``accuracy``)."""
    for a, b in zip(read_jsonl(first / "progress.jsonl"), read_jsonl(second / "progress.jsonl"), strict=True):
        assert abs(a["train_loss"] - b["train_loss"]) <= loss * abs(a["train_loss"]), (a, b)
        assert abs(a["eval_accuracy"] - b["eval_accuracy"]) <= accuracy, (a, b)


# Two trainings of the small recipe (train_variants), one on the device path: its crops within the
# tolerance above of the CPU path's: train loss within 1 % (measured 0.03-0.4 %), eval accuracy within one
# image of the 32 (measured equal).
DEVICE_PATH_PROGRESS = {"loss": 0.01, "accuracy": 1 / 32}


def trainer_flags(settings: dict[str, object]) -> list[str]:
    """Trainer settings as its flags: ``{"resume": True, "pretrained": False}`` -> ``--resume
    --no-pretrained``."""
    out = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        out += [flag] if value is True else [f"--no-{flag[2:]}"] if value is False else [flag, str(value)]
    return out


def sigterm_after_first_step(
    cmd: list[str], env: dict[str, str], log_path: Path, timeout: float
) -> tuple[int, str]:
    """Start ``cmd`` (its output to ``log_path``), send it SIGTERM once it logged its first training step,
    and wait for its exit: (exit code, its log)."""
    import signal

    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while "first training step done" not in log_path.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=90)
        finally:
            proc.kill()
    return code, log_path.read_text()


def write_mixed_set(directory: Path) -> Path:
    """Synthetic JPEGs of two sizes, plus a PNG, a grayscale JPEG and a CMYK JPEG (the GPU's batched
    decoder refuses the last two: each is decoded alone, then on the CPU)."""
    import numpy as np
    from PIL import Image

    from pets_training.synthetic import write_synthetic

    write_synthetic(directory, 3, 8, 48, seed=1)
    write_synthetic(directory / "big", 3, 2, 71, seed=2)
    for path in (directory / "big").iterdir():
        label, n = path.stem.rsplit("_", 1)
        path.rename(directory / f"{label}_{90 + int(n)}.jpg")
    (directory / "big").rmdir()
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 255, (40, 56, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(directory / "Bengal_100.png")
    Image.fromarray(pixels[:, :, 0]).save(directory / "Bengal_101.jpg")
    Image.fromarray(pixels).convert("CMYK").save(directory / "Bengal_102.jpg")
    return directory


def assert_device_path_gives_the_cpu_paths_crops(data: Any, device: Any) -> None:
    """The device input path on ``device`` (nvJPEG and the crops there on a GPU) crops the training set of
    ``data`` (a PetsData), for two epochs, within the tolerance of the CPU path's crops."""
    import torch

    from pets_training.device_input import DeviceCrops, EncodedImages, collate_encoded

    paths = data.train.files()
    assert paths is not None and len(paths) == len(data.train)
    encoded = EncodedImages(paths, data.train.labels)
    crops = DeviceCrops(data.train, paths, device)
    n = len(data.train)
    for epoch in (0, 3):
        keys = [epoch * n + i for i in range(n)]
        images, labels = crops(collate_encoded([encoded[k] for k in keys]))
        assert images.device.type == device.type and images.dtype == torch.uint8
        assert images.shape == (n, 3, 32, 32)
        assert_crops_close(images.cpu(), torch.stack([data.train[k][0] for k in keys]))
        assert labels.tolist() == data.train.labels
