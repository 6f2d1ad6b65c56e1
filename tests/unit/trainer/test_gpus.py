"""A pod given GPUs (PETS_GPUS) trains on them or fails permanently, naming what it found (gpus.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pets_contract import exits
from pets_contract.env import EXIT_CODE_FILE, GPUS
from pets_training import contract
from pets_training.gpus import GpuReport, driver_needed, driver_version, gpu_shortfall

from .helpers import BIN, read_json

pytestmark = pytest.mark.unit

NO_GPU = GpuReport(
    available=False, count=0, torch_version="2.15.0+cu132", torch_cuda="13.2", driver="570.86.15",
    device_files=("/dev/nvidia0",), visible=(("NVIDIA_VISIBLE_DEVICES", "GPU-1234"),),
    torch_said="CUDA initialization: The NVIDIA driver on your system is too old (found version 12080).",
)  # fmt: skip
TWO_GPUS = GpuReport(
    available=True, count=2, torch_version="2.15.0+cu132", torch_cuda="13.2", driver="580.65.06",
    device_files=("/dev/nvidia0", "/dev/nvidia1"), visible=(),
)  # fmt: skip


def test_given_one_gpu_and_finding_none_names_what_it_found_and_what_the_image_needs() -> None:
    text = gpu_shortfall(1, NO_GPU)
    assert text is not None and "\n" not in text
    for part in (
        "PETS_GPUS=1: the pod was given 1 GPU(s) (spec.resources.gpu) but torch finds 0",
        "NVIDIA driver 570.86.15",
        "torch 2.15.0+cu132 built for CUDA 13.2",
        "device files /dev/nvidia0 in /dev",
        "NVIDIA_VISIBLE_DEVICES='GPU-1234'",
        "torch says: CUDA initialization: The NVIDIA driver on your system is too old",
        "The image needs an NVIDIA driver >= 580 (torch's CUDA 13.2) on the node",
        "not training on the CPU instead",
    ):
        assert part in text, (part, text)


def test_given_none_or_finding_enough_there_is_nothing_to_say() -> None:
    assert gpu_shortfall(0, NO_GPU) is None
    assert gpu_shortfall(0, TWO_GPUS) is None
    assert gpu_shortfall(2, TWO_GPUS) is None
    assert gpu_shortfall(1, TWO_GPUS) is None


def test_finding_fewer_than_given_counts_as_missing() -> None:
    text = gpu_shortfall(4, TWO_GPUS)
    assert text is not None and "given 4 GPU(s)" in text and "torch finds 2" in text
    assert "neither CUDA_VISIBLE_DEVICES nor NVIDIA_VISIBLE_DEVICES set" in text
    assert "torch says" not in text


def test_the_driver_floor_follows_the_wheel_s_cuda() -> None:
    assert driver_needed("13.2") == "an NVIDIA driver >= 580 (torch's CUDA 13.2)"
    assert driver_needed("12.8") == "an NVIDIA driver >= 525.60.13 (torch's CUDA 12.8)"
    assert driver_needed(None) == "a CUDA build of torch (this one is CPU-only)"
    assert driver_needed("14.0") == "an NVIDIA driver that supports CUDA 14.0"


@pytest.mark.parametrize("line", [
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16)",
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:29 UTC 2025",
])
def test_the_driver_version_is_read_from_the_kernel_module_when_there_is_no_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str
) -> None:
    version = tmp_path / "version"
    version.write_text(f"{line}\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi on it
    assert driver_version(version) == "580.65.06"
    assert driver_version(tmp_path / "absent") is None


def test_the_pod_contract_reads_the_gpus_it_was_given() -> None:
    assert contract.PodContract.from_env({}).gpus == 0
    assert contract.PodContract.from_env({GPUS: "2"}).gpus == 2
    with pytest.raises(contract.ContractError, match="PETS_GPUS must be an integer, got 'one'"):
        contract.PodContract.from_env({GPUS: "one"})


@pytest.mark.timeout(150)
def test_a_trainer_given_a_gpu_on_this_cpu_machine_exits_78_saying_why(tmp_path: Path) -> None:
    """The image's entry point, as the operator starts it on a pod given a GPU that CUDA does not see."""
    env = {k: v for k, v in os.environ.items() if k != EXIT_CODE_FILE}
    env.update({GPUS: "1", "CUDA_VISIBLE_DEVICES": ""})  # none, even on a machine with one
    proc = subprocess.run(
        [str(BIN / "pets-launch"), "--synthetic-classes", "2", "--synthetic-images-per-class", "4",
         "--no-pretrained", "--output-dir", str(tmp_path / "out"), "--summary-path",
         str(tmp_path / "termination-log")],
        env=env, capture_output=True, text=True, timeout=140,
    )  # fmt: skip
    assert proc.returncode == exits.PERMANENT, proc.stderr[-3000:]
    summary = read_json(tmp_path / "termination-log")
    assert summary["status"] == "failed"
    assert summary["error"].startswith("PETS_GPUS=1: the pod was given 1 GPU(s) (spec.resources.gpu) but "
                                       "torch finds 0"), summary
    assert "CUDA_VISIBLE_DEVICES=''" in summary["error"]
    assert "The image needs an NVIDIA driver" in summary["error"]
    assert "permanent: exit 78" in proc.stderr
    assert "first training step" not in proc.stderr
