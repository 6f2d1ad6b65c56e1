"""How many CPUs this container may use, and what that means for threads and DataLoader workers.

In a pod the host's core count (``os.cpu_count()``) is wrong: the container's CPU limit is a CFS quota.
The order is: cgroup v1 quota, cgroup v2 ``cpu.max``, ``PETS_CPU_LIMIT``, then the CPUs this process
may run on.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from pets_contract.env import CPU_LIMIT

DEFAULT_CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class CpuLimit:
    cpus: int
    source: str  # where the number came from, for the log line


def _quota_to_cpus(quota: int, period: int) -> int | None:
    return max(1, math.ceil(quota / period)) if quota > 0 and period > 0 else None


def cgroup_v1_cpus(root: Path) -> int | None:
    """CPUs from a cgroup v1 CFS quota (``cpu.cfs_quota_us`` is -1 when unlimited)."""
    for controller in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        quota_file = root / controller / "cpu.cfs_quota_us"
        period_file = root / controller / "cpu.cfs_period_us"
        if quota_file.is_file() and period_file.is_file():
            try:
                return _quota_to_cpus(
                    int(quota_file.read_text().strip()), int(period_file.read_text().strip())
                )
            except ValueError:
                return None
    return None


def cgroup_v2_cpus(root: Path) -> int | None:
    """CPUs from a cgroup v2 ``cpu.max`` ("max 100000" when unlimited, else "QUOTA PERIOD")."""
    cpu_max = root / "cpu.max"
    if not cpu_max.is_file():
        return None
    parts = cpu_max.read_text().split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        return _quota_to_cpus(int(parts[0]), int(parts[1]))
    except ValueError:
        return None


def _available_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_limit(
    declared: int | None = None,
    cgroup_root: Path = DEFAULT_CGROUP_ROOT,
    available: int | None = None,
) -> CpuLimit:
    """The number of CPUs this container may use, and where that number came from.

    ``declared`` is the pod's ``PETS_CPU_LIMIT`` (:attr:`.contract.PodContract.cpu_limit`), used when the
    cgroup does not say."""
    available = _available_cpus() if available is None else available
    if (v1 := cgroup_v1_cpus(cgroup_root)) is not None:
        return CpuLimit(min(v1, available), f"cgroup v1 quota ({cgroup_root}/cpu/cpu.cfs_quota_us)")
    if (v2 := cgroup_v2_cpus(cgroup_root)) is not None:
        return CpuLimit(min(v2, available), f"cgroup v2 quota ({cgroup_root}/cpu.max)")
    if declared is not None:
        return CpuLimit(declared, CPU_LIMIT)
    return CpuLimit(available, "CPUs available to this process")


@dataclass(frozen=True)
class CpuPlan:
    threads: int  # torch intra-op threads per training process
    workers: int  # DataLoader worker processes per training process


def plan_cpu(
    cpus: int, local_processes: int, threads: int | None = None, workers: int | None = None
) -> CpuPlan:
    """Split the container's CPUs between the training processes of this machine.

    Each process gets ``cpus // local_processes`` compute threads (at least 1). The training process's own
    thread needs one of its cores; the input path's workers get every other one (on a GPU they set the
    pace: one core decodes and crops about 750 images/s, the step takes thousands). With one CPU a worker
    has nothing to overlap with, and its forkserver's imports cost 2.4 s of that CPU before the first
    step: none then. On a CPU the workers share the cores with the compute threads, which they leave
    idle once their batches are ready.
    """
    if local_processes < 1:
        raise ValueError(f"local_processes must be >= 1, got {local_processes}")
    per_process = max(1, cpus // local_processes)
    return CpuPlan(
        threads=threads if threads is not None else per_process,
        workers=workers if workers is not None else per_process - 1,
    )
