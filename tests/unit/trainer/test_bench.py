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


@pytest.mark.timeout(360)
def test_bench_runs_every_loop_this_cpu_affords_on_the_same_files_and_ends_with_the_speedup(
    tmp_path: Path, cpu_bf16: bool
) -> None:
    output, _ = run(
        [PYTHON, "-m", "pets_training.bench", "--model", "resnet10t", "--image-size", "64",
         "--batch-size", "8", "--jpeg-size", "80", "--steps", "2", "--repeats", "1", "--cpus", "1",
         "--output", str(tmp_path / "out")],
        timeout=340, env={"PETS_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    result = read_json(tmp_path / "out" / "bench.json")
    # with bf16 instructions the tutorial's fp16 runs as bf16; without, it is skipped and bench.json says why
    if cpu_bf16:
        loops = ["tutorial", "tutorial-mp", "ours", "ours-device", "ours-store", "ceiling"]
        assert result["skipped"] == {} and result["mixed_precision"] == "bf16"
        assert "tutorial-mp: bf16; every loop on 1 core(s)" in output
    else:
        loops = ["tutorial", "ours", "ours-device", "ours-store", "ceiling"]
        assert result["skipped"] == {"tutorial-mp": (
            "this CPU has no bf16 instructions (AVX-512 BF16 or AMX), where torch emulates bf16 (one step "
            "took over 3 min); the loops run without mixed precision here, as our trainer runs the "
            "tutorial's fp16: the tutorial as written")}, result["skipped"]
        assert result["mixed_precision"] == "no"
        assert "tutorial-mp: skipped: this CPU has no bf16 instructions" in output
    assert result["loops"] == loops and list(result["images_per_second"]) == loops
    # the loops side by side, each with its ratio to the tutorial as written and its share of the ceiling
    described = [line.split(" (")[0].split(":")[0] for line in result["lines"][:-2]]
    assert described == [{"tutorial": "tutorial loop as written", "ours": "ours",
                          "tutorial-mp": "tutorial loop with its mixed precision",
                          "ours-device": "ours on the device input path",
                          "ours-store": "ours on the device input path from its input store",
                          "ceiling": "model-only ceiling"}[name] for name in loops]  # fmt: skip
    assert result["lines"][0].endswith(" % of the ceiling)") and " images/s (1.00x, " in result["lines"][0]
    assert result["lines"][len(loops) - 1].endswith(", 100 % of the ceiling)")
    assert output.strip().splitlines()[-len(result["lines"]):] == result["lines"]  # what bench printed
    ours_line = result["lines"][-2]
    assert ours_line.startswith("ours at ") and ours_line.endswith("% of the model-only ceiling")
    assert "1 CPU(s) from CPUs available to this process" in (tmp_path / "out" / "ours-1.log").read_text()
    assert "input path device (asked)" in (tmp_path / "out" / "ours-device-1.log").read_text()
    store_log = (tmp_path / "out" / "ours-store-1.log").read_text()
    assert "input path device (asked)" in store_log and "input store " in store_log, store_log[-2000:]
    assert (tmp_path / "out" / "bench.png").read_bytes().startswith(b"\x89PNG")  # the loops, plotted
    # one core: no loader worker, so our CPU path decodes its batches in the loop and waits for them
    shares = result["input_wait_share"]
    assert set(shares) == {"ours", "ours-device", "ours-store"} and 0 < shares["ours"] < 1, shares
    assert f"waiting for input, share of the training time: ours {100 * shares['ours']:.0f} %" in output
    ips = result["images_per_second"]
    assert all(v > 0 for v in ips.values()) and result["cpus"] == 1
    assert result["speedup"] == pytest.approx(ips["ours"] / ips["tutorial"], rel=1e-2)
    # The line shows 2 decimals of the ratio, the JSON 3: they agree to the line's rounding (formatting
    # the JSON's rounded value again could differ in the last digit).
    assert float(result["lines"][-1].removeprefix("speedup: ").removesuffix("x")) == pytest.approx(
        result["speedup"], abs=0.0051)
    assert len(list((tmp_path / "cache").glob("bench-jpegs-*/*.jpg"))) >= 37


def test_report_gives_each_loop_its_ratio_and_ends_with_the_speedup() -> None:
    from pets_training.bench import report

    lines = report({"tutorial": 10.0, "tutorial-mp": 20.0, "ours": 40.0, "ceiling": 50.0}, "bf16")
    assert lines[0].endswith(": 10.00 images/s (1.00x, 20 % of the ceiling)")
    assert lines[1].startswith("tutorial loop with its mixed precision (bf16): 20.00 images/s (2.00x, 40 %")
    assert lines[2].endswith(": 40.00 images/s (4.00x, 80 % of the ceiling)")
    assert lines[3].endswith(": 50.00 images/s (5.00x, 100 % of the ceiling)")
    assert lines[4:] == ["ours at 80 % of the model-only ceiling", "speedup: 4.00x"]


def test_without_bf16_instructions_the_tutorials_mixed_precision_is_skipped_with_a_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pets_training import model
    from pets_training.bench import tutorial_precision

    monkeypatch.setattr(model, "cpu_runs_bf16_natively", lambda: False)
    mixed, line = tutorial_precision(on_gpu=False)
    assert mixed is None and line.startswith("tutorial-mp: skipped: this CPU has no bf16 instructions")
    monkeypatch.setattr(model, "cpu_runs_bf16_natively", lambda: True)
    assert tutorial_precision(on_gpu=False) == ("bf16", "tutorial-mp: bf16")
    assert tutorial_precision(on_gpu=True) == ("fp16", "tutorial-mp: fp16")
    # --mixed-precision bf16 (tests/gpu/run.sh runs both): kept where bf16 is native, skipped where emulated
    assert tutorial_precision(on_gpu=False, asked="bf16") == ("bf16", "tutorial-mp: bf16")
    assert tutorial_precision(on_gpu=True, asked="bf16") == ("bf16", "tutorial-mp: bf16")
    monkeypatch.setattr(model, "cpu_runs_bf16_natively", lambda: False)
    assert tutorial_precision(on_gpu=False, asked="bf16")[0] is None
    assert tutorial_precision(on_gpu=False, asked="no") == (
        None, "tutorial-mp: skipped: no mixed precision asked for, which is the tutorial as written")
