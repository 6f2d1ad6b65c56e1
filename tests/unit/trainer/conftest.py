"""Fixtures that force each side of a hardware branch, so every side runs on any machine (CI's included).

The trainer's hardware branches and what forces each side:
- bf16 instructions (AVX-512 BF16 or AMX) present or absent: ``PETS_CPU_BF16`` (``cpu_bf16`` below);
  the trainer and its benches read it in every process they start, so a real run takes the forced side.
- a GPU present or absent: ``CUDA_VISIBLE_DEVICES=""`` hides every GPU (CUDA's own switch); on a machine
  without one the GPU side runs only in the pure functions that take ``on_gpu`` as an argument.
- nvJPEG present, refusing, or absent: ``gpu_decoder_missing`` and the per-file fallback take the decoder
  as an argument in their tests (test_device_input.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pets_training.model import CPU_BF16_ENV


@pytest.fixture(params=["bf16", "no-bf16"])
def cpu_bf16(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[bool]:
    """Each test that takes it runs twice: as on a CPU with bf16 instructions, and as on one without."""
    present = request.param == "bf16"
    monkeypatch.setenv(CPU_BF16_ENV, "1" if present else "0")
    yield present
