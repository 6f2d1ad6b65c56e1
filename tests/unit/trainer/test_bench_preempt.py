"""``make bench-preempt``: the arithmetic, the parsing and the table, then one tiny real run of the driver."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pets_training.bench_preempt import (
    ROWS,
    Save,
    checkpoint_share,
    final_line,
    parse_metrics,
    parse_saves,
    preemption_cost,
    save_stats,
    seconds_per_step,
    table,
    target_step,
)

from .helpers import PYTHON, read_json, run

pytestmark = pytest.mark.unit

# saves.save_checkpoint's lines among others, as the trainer logs them
LOG = "\n".join([
    "01:20:07 INFO [rank 0] data synthetic: 8 classes x 100 images (in memory); 640 for training",
    "01:20:09 INFO [rank 0] checkpoint epoch_0_step_12 saved (global step 12): training blocked 0.09 s "
    "(0.09 s in this run)",
    "01:20:11 INFO [rank 0] checkpoint epoch_1 saved (global step 40): training blocked 0.12 s "
    "(0.21 s in this run)",
    "01:20:12 INFO [rank 0] checkpoint epoch_1_step_3 saved (global step 43): training blocked 1.50 s "
    "(1.71 s in this run)",
    "01:20:12 INFO [rank 0] stopped (SIGTERM received): exit 75",
])  # fmt: skip


def test_the_saves_are_read_from_the_trainers_log_line() -> None:
    saves = parse_saves(LOG)
    assert saves == [Save("epoch_0_step_12", 12, 0.09), Save("epoch_1", 40, 0.12),
                     Save("epoch_1_step_3", 43, 1.5)]  # fmt: skip
    assert [s.is_step for s in saves] == [True, False, True]
    assert parse_saves("no saves here\n") == []


def test_the_gauges_are_read_from_the_prometheus_text() -> None:
    text = (
        "# HELP pets_step optimizer steps taken so far in the whole run (resumed runs included)\n"
        "# TYPE pets_step gauge\n"
        "pets_step 61.0\n"
        "pets_train_seconds_total 3.25\n"
        'python_info{implementation="CPython"} 1.0\n'
        "pets_resume_step 0.0\n"
    )
    assert parse_metrics(text) == {
        "pets_step": 61.0, "pets_train_seconds_total": 3.25, "pets_resume_step": 0.0
    }  # fmt: skip


def test_the_preemption_point_is_counted_in_epochs_from_the_start() -> None:
    assert target_step(480, 3, 1.7) == 272  # 160 steps per epoch: 70 % into the second epoch
    assert target_step(80, 2, 1.5) == 60
    with pytest.raises(ValueError, match="inside the run"):
        target_step(80, 2, 2.0)
    with pytest.raises(ValueError, match="do not split"):
        target_step(81, 2, 1.5)
    with pytest.raises(ValueError, match="too close to an end"):
        target_step(4, 2, 0.1)


def test_the_lost_work_arithmetic() -> None:
    # the train gauge counts from the end of the run's first step: 61 steps read, 60 of them timed
    assert seconds_per_step(3.0, 61) == pytest.approx(0.05)
    assert seconds_per_step(3.0, 71, resume_step=10) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="no timed steps"):
        seconds_per_step(0.0, 1)

    # epoch checkpoints only: killed at step 272, resumed at the epoch_1 checkpoint (step 160)
    cost = preemption_cost(272, 160, 0.1, exit_seconds=0.05, restore_seconds=0.2)
    assert cost["lost_steps"] == 112
    assert cost["lost_work_seconds"] == pytest.approx(11.2)
    assert cost["lost_seconds"] == pytest.approx(11.2 + 0.05 + 0.2)
    # SIGTERM: the trainer finished the step it was on and saved after it, past the last read: nothing
    # is redone, and that step's 0.1 s of the 1.5 s to the exit is work kept, not lost
    cost = preemption_cost(272, 273, 0.1, exit_seconds=1.5, restore_seconds=0.2)
    assert cost["lost_steps"] == 0 and cost["lost_work_seconds"] == 0
    assert cost["stopping_seconds"] == pytest.approx(1.4)
    assert cost["lost_seconds"] == pytest.approx(1.6)


def test_the_stall_statistics() -> None:
    assert save_stats([]) is None
    stats = save_stats([0.09, 0.05, 0.30, 0.07])
    assert stats == {"count": 4, "median": pytest.approx(0.08), "max": 0.30, "total": pytest.approx(0.51)}
    assert checkpoint_share(0.5, 25.0) == pytest.approx(0.02)
    assert checkpoint_share(0.5, 0.0) == 0.0


def _result(key: str, label: str, lost: float, **extra: Any) -> dict[str, Any]:
    step_saves = save_stats([0.09, 0.11]) if key != "epoch-kill" else None
    return {
        "key": key, "label": label, "interval_seconds": 5.0 if key != "epoch-kill" else 0.0,
        "signal": "SIGTERM" if key == "step-term" else "SIGKILL",
        "exit_code": 75 if key == "step-term" else -9,
        "steps_total": 480, "last_read_step": 272, "resume_step": 160, "lost_steps": 112,
        "seconds_per_step": 0.1, "lost_work_seconds": 11.2, "exit_seconds": 0.05,
        "stopping_seconds": 0.05, "restore_seconds": 0.2, "lost_seconds": lost,
        "resumed_startup_seconds": 1.0, "step_saves": step_saves,
        "sigterm_save": 0.1 if key == "step-term" else None, "epoch_saves": save_stats([0.12]),
        "checkpoint_share": 0.02, **extra,
    }  # fmt: skip


def test_the_table_puts_the_scenarios_side_by_side_and_the_last_line_sums_them_up() -> None:
    results = [_result("epoch-kill", "epoch ckpts only, killed", 11.45),
               _result("step-kill", "step ckpts, killed", 2.5),
               _result("step-term", "step ckpts, SIGTERM", 1.75)]  # fmt: skip
    lines = table(results)
    assert len(lines) == 1 + len(ROWS)
    assert lines[0].split("  ")[-1].strip() == "step ckpts, SIGTERM"
    assert "epoch ckpts only, killed" in lines[0] and "step ckpts, killed" in lines[0]
    # every row starts with its label, then one cell per scenario, two spaces or more apart
    cells = {}
    for label, _ in ROWS:
        line = next(line for line in lines[1:] if line.startswith(label))
        cells[label] = [c.strip() for c in line[len(label):].split("  ") if c.strip()]
    assert cells["step checkpoint every"] == ["off", "5 s", "5 s"]
    assert cells["signal, exit code"] == ["SIGKILL, -9", "SIGKILL, -9", "SIGTERM, 75"]
    assert cells["LOST PER PREEMPTION s"] == ["11.45", "2.50", "1.75"]
    assert cells["lost steps (lower bound)"] == ["112", "112", "112"]
    assert cells["step saves: median / max s (n)"] == ["-", "0.10 / 0.11 (2)", "0.10 / 0.11 (2)"]
    assert cells["SIGTERM save blocked s"] == ["-", "-", "0.10"]
    assert cells["saving / training time"] == ["2.0 %"] * 3
    # the columns line up: every line has its cells right-aligned to the same widths
    assert len({len(line) for line in lines}) == 1
    assert final_line(results) == ("lost per preemption: epoch-only 11.45 s, step checkpoints (no notice) "
                                   "2.50 s, SIGTERM save 1.75 s")  # fmt: skip
    resized = _result("resize-term", "resized 2 -> 1, SIGTERM", 2.25)
    assert final_line([*results, resized]).endswith("SIGTERM save 1.75 s; per resize 2 -> 1 2.25 s")


@pytest.mark.timeout(420)
def test_a_tiny_bench_preempts_four_runs_resumes_them_and_reports(tmp_path: Path) -> None:
    # resnet10t at 32 px, 2 x 100 images -> 160 for training, batch 4: 40 steps per epoch, 2 epochs;
    # preempted at 1.5 epochs (step 60), halfway into the second epoch. The resize: 2 processes, a global
    # batch of 8, 20 steps per epoch (step 30), resumed on 1 process
    output, _ = run(
        [PYTHON, "-m", "pets_training.bench_preempt", "--model", "resnet10t", "--image-size", "32",
         "--classes", "2", "--images-per-class", "100", "--batch-size", "4", "--epochs", "2",
         "--interval", "0.1", "--preempt-at", "1.5", "--poll", "0.02", "--output", str(tmp_path),
         "--trainer-args=--mixed-precision no --num-workers 0 --threads 1 --eval-batch-size 16"],
        timeout=400,
    )  # fmt: skip
    lines = output.strip().splitlines()
    assert lines[-1].startswith("lost per preemption: epoch-only ") and lines[-1].endswith(" s"), output
    result = read_json(tmp_path / "bench-preempt.json")
    runs = {r["key"]: r for r in result["scenarios"]}
    assert list(runs) == ["epoch-kill", "step-kill", "step-term", "resize-term"]
    for r in runs.values():
        steps = 80 if r["key"] != "resize-term" else 40
        assert r["steps_total"] == steps and r["target_step"] == steps * 3 // 4, r
        assert r["last_read_step"] >= r["target_step"]
        assert r["seconds_per_step"] > 0 and r["restore_seconds"] > 0
        assert r["stopping_seconds"] <= r["exit_seconds"]
        parts = r["lost_work_seconds"] + r["stopping_seconds"] + r["restore_seconds"]
        assert r["lost_seconds"] == pytest.approx(parts)
        assert r["epoch_saves"]["count"] >= 2  # epoch_1 before the preemption, epoch_2 at the end
        assert (Path(r["output_dir"]) / "summary.json").exists()
        assert not (Path(r["output_dir"]) / "checkpoints").exists()  # removed: no --keep-checkpoints
    # epoch checkpoints only: the kill went back to epoch_1, a whole half epoch (at least) redone
    epoch = runs["epoch-kill"]
    assert epoch["exit_code"] == -9 and epoch["interval_seconds"] == 0
    assert epoch["resume_step"] == 40 and epoch["lost_steps"] >= 20 and epoch["step_saves"] is None
    # step checkpoints, killed: back to the newest step checkpoint
    step = runs["step-kill"]
    assert step["exit_code"] == -9 and step["step_saves"]["count"] >= 1
    assert 40 <= step["resume_step"] <= step["last_read_step"] + 3
    # SIGTERM: saved after the step it was on, exit 75, resumed there: nothing redone
    term = runs["step-term"]
    assert term["exit_code"] == 75 and term["lost_steps"] == 0 and term["lost_work_seconds"] == 0
    assert term["resume_step"] >= term["last_read_step"] and term["sigterm_save"] is not None
    # the resize: the same, from 2 processes to 1
    resize = runs["resize-term"]
    assert resize["exit_code"] == 75 and resize["lost_steps"] == 0 and resize["processes"] == [2, 1]
    assert resize["resume_step"] >= resize["last_read_step"]
    assert result["lost_seconds"] == {k: round(r["lost_seconds"], 3) for k, r in runs.items()}
    assert any(line.startswith("LOST PER PREEMPTION s") for line in lines)
