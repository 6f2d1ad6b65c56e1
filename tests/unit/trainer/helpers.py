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
]  # fmt: skip

PYTHON = sys.executable
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
