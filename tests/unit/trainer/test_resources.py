from pathlib import Path

import pytest

from pets_training.contract import PodContract
from pets_training.resources import CpuPlan, cpu_limit, plan_cpu

pytestmark = pytest.mark.unit


def _declared(value: str) -> int | None:
    """PETS_CPU_LIMIT as the pod contract reads it."""
    return PodContract.from_env({"PETS_CPU_LIMIT": value}).cpu_limit


def _v1(root: Path, quota: str, period: str = "100000") -> None:
    (root / "cpu").mkdir(parents=True)
    (root / "cpu" / "cpu.cfs_quota_us").write_text(quota + "\n")
    (root / "cpu" / "cpu.cfs_period_us").write_text(period + "\n")


def test_cgroup_v1_quota_rounds_up(tmp_path: Path) -> None:
    _v1(tmp_path, "150000")
    limit = cpu_limit(None, cgroup_root=tmp_path, available=16)
    assert limit.cpus == 2 and "cgroup v1" in limit.source


def test_cgroup_v1_unlimited_falls_through_to_env_then_available(tmp_path: Path) -> None:
    _v1(tmp_path, "-1")
    assert cpu_limit(_declared("3"), cgroup_root=tmp_path, available=16).cpus == 3
    limit = cpu_limit(None, cgroup_root=tmp_path, available=16)
    assert limit.cpus == 16 and "available" in limit.source


def test_cgroup_v2_cpu_max(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("400000 100000\n")
    assert cpu_limit(_declared("9"), cgroup_root=tmp_path, available=16).cpus == 4
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpu_limit(_declared("9"), cgroup_root=tmp_path, available=16).cpus == 9


def test_quota_never_exceeds_the_cpus_we_may_run_on(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("800000 100000\n")
    assert cpu_limit(None, cgroup_root=tmp_path, available=2).cpus == 2


def test_bad_env_value_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="PETS_CPU_LIMIT must be a number of CPUs, got 'lots'"):
        cpu_limit(_declared("lots"), cgroup_root=tmp_path, available=2)
    assert cpu_limit(_declared("1.5"), cgroup_root=tmp_path, available=2).cpus == 2


def test_this_machine_reports_something_sane() -> None:
    limit = cpu_limit()
    assert limit.cpus >= 1 and limit.source


@pytest.mark.parametrize(
    ("cpus", "workers"),
    [(1, 0), (2, 1), (4, 3), (8, 7), (16, 15)],  # 1 and 2: as tuned before (docs/trainer.md)
)
def test_the_input_path_gets_every_core_but_the_training_process_own(cpus: int, workers: int) -> None:
    assert plan_cpu(cpus, 1) == CpuPlan(threads=cpus, workers=workers)


def test_plan_splits_cpus_between_local_processes() -> None:
    assert plan_cpu(8, 2) == CpuPlan(threads=4, workers=3)  # 8 CPUs, 2 processes: 4 threads, 3 workers each
    assert (plan_cpu(2, 2).threads, plan_cpu(2, 2).workers) == (1, 0)  # one CPU each: no worker
    assert (plan_cpu(3, 1).threads, plan_cpu(3, 1).workers) == (3, 2)
    assert (plan_cpu(9, 2).threads, plan_cpu(9, 2).workers) == (4, 3)  # the odd CPU is left over
    assert plan_cpu(8, 2, threads=3, workers=0) == CpuPlan(threads=3, workers=0)  # explicit values win, 0 too
    with pytest.raises(ValueError, match="local_processes must be >= 1"):
        plan_cpu(2, 0)
