from pathlib import Path

import pytest

from pets_training.bench import throughput

from .helpers import PYTHON, read_json, run

pytestmark = pytest.mark.unit


def test_throughput_counts_only_the_timed_steps() -> None:
    # step ends at t = 10 (warm-up), 12, 14, 16: 3 timed steps of 8 images in 6 s
    assert throughput([10.0, 12.0, 14.0, 16.0], [8, 8, 8, 8], warmup=1) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="warmup must be at least 1"):
        throughput([1.0, 2.0], [8, 8], warmup=0)
    with pytest.raises(ValueError, match="need more than 2 steps, got 2"):
        throughput([1.0, 2.0], [8, 8], warmup=2)


@pytest.mark.timeout(300)
def test_bench_runs_both_loops_on_the_same_files_and_ends_with_the_speedup(tmp_path: Path) -> None:
    output, _ = run(
        [PYTHON, "-m", "pets_training.bench", "--model", "resnet10t", "--image-size", "64",
         "--batch-size", "8", "--jpeg-size", "80", "--steps", "2", "--repeats", "1",
         "--output", str(tmp_path / "out")],
        timeout=280, env={"PETS_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    lines = output.strip().splitlines()
    assert lines[-1].startswith("speedup: ") and lines[-1].endswith("x")
    assert "baseline (tutorial loop" in output and "ours (pets-train" in output
    result = read_json(tmp_path / "out" / "bench.json")
    ratio = result["ours_images_per_second"] / result["baseline_images_per_second"]
    assert result["speedup"] == pytest.approx(ratio, rel=1e-2)
    assert len(list((tmp_path / "cache").glob("bench-jpegs-*/*.jpg"))) >= 37
