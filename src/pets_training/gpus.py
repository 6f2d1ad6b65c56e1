"""A pod given GPUs trains on them, or fails saying why: the check (pure), and what it reads.

The operator sets ``PETS_GPUS`` on a pod with ``spec.resources.gpu`` > 0. Without this check a pod whose
CUDA does not work (a driver older than the image's CUDA needs, or no device from the device plugin)
would train on the CPU, about 100x slower, without a word.
"""

from __future__ import annotations

import re
import subprocess
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from pets_contract.env import GPUS

from .contract import PermanentError

# the oldest NVIDIA driver each CUDA major runs on (minor-version compatibility), the wheel's CUDA -> floor
DRIVER_FLOOR = {13: "580", 12: "525.60.13"}
VISIBLE_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
PROC_VERSION = Path("/proc/driver/nvidia/version")


class GpuMissingError(PermanentError):
    """The pod was given GPUs and this container finds fewer: the node's driver or device plugin must
    change, which no restart of the trainer does."""


@dataclass(frozen=True)
class GpuReport:
    """What this container sees of its GPUs."""

    available: bool  # torch.cuda.is_available()
    count: int  # torch.cuda.device_count() where available, else 0
    torch_version: str
    torch_cuda: str | None  # torch.version.cuda: None for a CPU-only build
    driver: str | None  # from nvidia-smi or /proc/driver/nvidia/version; None: neither says
    device_files: tuple[str, ...]  # /dev/nvidia0, ...: what the device plugin mounted
    visible: tuple[tuple[str, str], ...]  # CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES, where set
    torch_said: str | None = None  # torch's warning when CUDA failed to start (e.g. "driver too old")


def driver_needed(torch_cuda: str | None) -> str:
    """What the image needs of the node's driver, in words."""
    if torch_cuda is None:
        return "a CUDA build of torch (this one is CPU-only)"
    floor = DRIVER_FLOOR.get(int(torch_cuda.split(".")[0]))
    if floor is None:
        return f"an NVIDIA driver that supports CUDA {torch_cuda}"
    return f"an NVIDIA driver >= {floor} (torch's CUDA {torch_cuda})"


def gpu_shortfall(given: int, found: GpuReport) -> str | None:
    """The error text when the pod was given ``given`` GPUs and ``found`` shows fewer usable ones; None when
    it was given none, or finds enough."""
    usable = found.count if found.available else 0
    if given <= 0 or usable >= given:
        return None
    visible = ", ".join(f"{name}={value!r}" for name, value in found.visible) or "neither " + " nor ".join(
        VISIBLE_ENV) + " set"
    said = f"; torch says: {found.torch_said}" if found.torch_said else ""
    return (
        f"{GPUS}={given}: the pod was given {given} GPU(s) (spec.resources.gpu) but torch finds {usable} "
        f"(cuda available: {found.available}); found: NVIDIA driver {found.driver or 'unknown'}, torch "
        f"{found.torch_version} built for CUDA {found.torch_cuda or 'none'}, device files "
        f"{', '.join(found.device_files) or 'none'} in /dev, {visible}{said}. The image needs "
        f"{driver_needed(found.torch_cuda)} on the node, the NVIDIA container toolkit and the GPU(s) from "
        "the device plugin; not training on the CPU instead"
    )


def driver_version(proc_version: Path = PROC_VERSION) -> str | None:
    """The node's NVIDIA driver version, from nvidia-smi (the container toolkit's ``utility``), else the
    kernel module's /proc file; None where neither says."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=False)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.split()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        match = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s", proc_version.read_text())
    except OSError:
        return None
    return match.group(1) if match else None


def look(env: Mapping[str, str], dev: Path = Path("/dev")) -> GpuReport:
    """What this container sees: torch's CUDA (and what it warned, starting it), the driver, the device
    files and the visibility variables."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
    said = "; ".join(" ".join(str(w.message).split()) for w in caught) or None
    return GpuReport(
        available=available,
        count=count,
        torch_version=torch.__version__,
        torch_cuda=torch.version.cuda,
        driver=driver_version(),
        device_files=tuple(sorted(str(p) for p in dev.glob("nvidia[0-9]*"))),
        visible=tuple((name, env[name]) for name in VISIBLE_ENV if name in env),
        torch_said=said,
    )


def use_gpu(given: int, env: Mapping[str, str]) -> bool:
    """Whether to train on the GPU: where the pod was given none, whether CUDA works here (as before);
    where it was given some, yes, or :class:`GpuMissingError` when fewer work."""
    if given <= 0:
        return torch.cuda.is_available()
    problem = gpu_shortfall(given, look(env))
    if problem is not None:
        raise GpuMissingError(problem)
    return True
