"""``make bench-startup`` (issue 56, section 5): the trainer's start on a folder of files, split by what it
did, without a store, building it and with it fresh; and the split itself (TimeSplit.startup_done)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pets_training.bench_startup import RUNS
from pets_training.progress import TimeSplit

from .helpers import PYTHON, read_json, run

pytestmark = pytest.mark.unit


def test_the_startup_parts_add_up_to_the_first_step_and_stop_there() -> None:
    split = TimeSplit(start=100.0)
    split.startup_done("imports", now=103.0)
    split.startup_done("data", now=103.5)
    split.startup_done("data", now=104.0)  # a part done twice adds up
    split.first_step_done(now=106.25)
    split.startup_done("late", now=110.0)  # after the first step: training, not start-up
    assert split.startup_parts == {"imports": 3.0, "data": 1.0, "first step": 2.25}
    assert split.rounded()["startup"] == pytest.approx(sum(split.startup_parts.values()))


@pytest.mark.timeout(300)
def test_bench_startup_runs_three_starts_and_splits_each(tmp_path: Path) -> None:
    output, _ = run([PYTHON, "-m", "pets_training.bench_startup", "--files", "80", "--model", "resnet10t",
                     "--image-size", "32", "--batch-size", "8", "--output", str(tmp_path / "out")],
                    timeout=280, env={"PETS_CACHE": str(tmp_path / "cache")})  # fmt: skip
    result = read_json(tmp_path / "out" / "bench-startup.json")
    assert list(result["runs"]) == list(RUNS) and result["files"] == 80
    for name, measured in result["runs"].items():
        parts = measured["parts"]
        assert list(parts)[0] == "imports" and list(parts)[-1] == "first step", (name, parts)
        assert {"data", "model", "first batch"} <= set(parts), (name, parts)
        assert sum(parts.values()) == pytest.approx(measured["startup_seconds"], abs=0.01), (name, measured)
        assert f"{name}: first step {measured['startup_seconds']:.1f} s after the process's start" in output
    logs = {name: (tmp_path / "out" / f"{name.replace(' ', '-')}.log").read_text() for name in RUNS}
    assert "input store" not in logs["no store"]
    assert ": building it (there is none yet)" in logs["building the store"]
    assert ": reusing it (80 decoded images)" in logs["store fresh"]
    assert (tmp_path / "out" / "bench-startup.png").read_bytes().startswith(b"\x89PNG")
    assert len(list((tmp_path / "cache").glob("bench-startup-pets-80/*.jpg"))) == 80
