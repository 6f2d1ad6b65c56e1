import json
import urllib.request
from pathlib import Path

import pytest

from pets_training.progress import (
    SUMMARY_LIMIT,
    MetricsServer,
    StepProgress,
    append_progress,
    epoch_record,
    plot_metrics,
    summary_json,
    write_summary,
)

from .helpers import PYTHON, free_port, read_jsonl, run

pytestmark = pytest.mark.unit


def test_epoch_record_has_the_contract_keys_and_an_eta() -> None:
    record = epoch_record(2, 5, 0.5, 0.9, 100.0, 30.0, [10.0, 20.0])
    assert list(record) == [
        "epoch",
        "total_epochs",
        "train_loss",
        "eval_accuracy",
        "images_per_second",
        "elapsed_seconds",
        "eta_seconds",
    ]
    assert record["eta_seconds"] == 45.0  # mean 15 s x 3 epochs left


def test_progress_lines_append(tmp_path: Path) -> None:
    append_progress(tmp_path, epoch_record(1, 2, 1.0, 0.5, 1.0, 1.0, [1.0]))
    append_progress(tmp_path, epoch_record(2, 2, 0.5, 0.8, 1.0, 2.0, [1.0, 1.0]))
    assert [r["epoch"] for r in read_jsonl(tmp_path / "progress.jsonl")] == [1, 2]


def test_summary_fits_a_termination_message(tmp_path: Path) -> None:
    text = summary_json({"status": "failed", "error": "x" * 10_000})
    assert len(text.encode()) <= SUMMARY_LIMIT and json.loads(text)["error"].endswith("[cut]")
    write_summary({"status": "succeeded"}, [tmp_path / "a.json", None, tmp_path / "no" / "dir" / "b.json"])
    assert json.loads((tmp_path / "a.json").read_text()) == {"status": "succeeded"}


def test_metrics_server_serves_the_contract_gauges() -> None:
    port = free_port()
    server = MetricsServer(port)
    try:
        server.update(epoch_record(3, 5, 0.25, 0.875, 42.0, 60.0, [20.0]))
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        server.close()
    for line in (
        "pets_epoch 3.0",
        "pets_total_epochs 5.0",
        "pets_train_loss 0.25",
        "pets_eval_accuracy 0.875",
        "pets_images_per_second 42.0",
        "pets_elapsed_seconds 60.0",
        "pets_eta_seconds 40.0",
    ):
        assert line in body


def test_metrics_server_serves_no_gauge_before_its_first_value() -> None:
    port = free_port()
    server = MetricsServer(port)
    try:
        server.set("step", 7)
        server.set("steps_total", 40)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        server.close()
    assert "pets_step 7.0" in body and "pets_steps_total 40.0" in body
    # No epoch has ended: a loss, an accuracy or an epoch of 0 would be read as measurements.
    for name in ("pets_epoch", "pets_total_epochs", "pets_train_loss", "pets_eval_accuracy",
                 "pets_eta_seconds"):
        assert f"\n{name} " not in body, name


def test_plot_is_a_png(tmp_path: Path) -> None:
    history = [epoch_record(e, 3, 1.0 / e, 0.3 * e, 1.0, e, [1.0]) for e in (1, 2, 3)]
    plot_metrics(history, tmp_path / "metrics.png")
    assert (tmp_path / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_periodic_lines_when_not_a_terminal(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="pets_training")
    bar = StepProgress(total=3, epoch=1, epochs=2, enabled=True, every=1e-9, tty=False)
    for _ in range(3):
        bar.update(0.5, 8)
    bar.close()
    assert caplog.text.count("epoch 1/2 step") == 3


def test_metrics_server_serves_the_step_and_checkpoint_gauges() -> None:
    port = free_port()
    server = MetricsServer(port)
    try:
        server.set("step", 12)
        server.set("steps_total", 40)
        server.set("checkpoint_epoch", 2)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        server.close()
    assert server.values == {"step": 12.0, "steps_total": 40.0, "checkpoint_epoch": 2.0}
    for line in ("pets_step 12.0", "pets_steps_total 40.0", "pets_checkpoint_epoch 2.0"):
        assert line in body


# Trains in a child process (a fresh accelerate state) and scrapes rank 0's endpoint from the step hook.
SCRAPER = """
import json, sys, urllib.request
from pets_training.train import training_function

settings, port = json.loads(sys.argv[1]), int(sys.argv[2])
seen = []

def hook(step, images):
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values = dict(line.split() for line in body.splitlines() if line.startswith("pets_"))
    seen.append({"hook_step": step, **{k: float(v) for k, v in values.items()}})

training_function(settings, step_hook=hook)
print("SEEN " + json.dumps(seen))
"""


def _scrape_run(settings: dict[str, object]) -> list[dict[str, float]]:
    output, _ = run([PYTHON, "-c", SCRAPER, json.dumps(settings), str(settings["metrics_port"])], timeout=170)
    seen: list[dict[str, float]] = json.loads(output.split("SEEN ", 1)[1].splitlines()[0])
    return seen


@pytest.mark.timeout(240)
def test_a_run_serves_its_step_and_checkpoint_and_resume_continues_them(tmp_path: Path) -> None:
    settings: dict[str, object] = {
        "model": "resnet10t",
        "image_size": 32,
        "synthetic_classes": 2,
        "synthetic_images_per_class": 10,  # 16 for training -> 4 steps per epoch
        "epochs": 3,
        "batch_size": 4,
        "eval_batch_size": 8,
        "mixed_precision": "no",
        "num_workers": 0,
        "threads": 1,
        "output_dir": str(tmp_path),
        "max_epochs_this_run": 2,
        "resume": True,
        "pretrained": False,  # no internet here
    }
    first = _scrape_run({**settings, "metrics_port": free_port()})
    assert [s["hook_step"] for s in first] == list(range(1, 9))
    assert all(s["pets_step"] == s["hook_step"] for s in first)  # set every step, before the hook
    assert {s["pets_steps_total"] for s in first} == {12.0}  # 4 steps x 3 epochs
    assert [s["pets_checkpoint_epoch"] for s in first] == [0.0] * 4 + [1.0] * 4  # after epoch 1's save
    assert {s["pets_resume_step"] for s in first} == {0.0}  # --resume found nothing: a fresh start

    second = _scrape_run({**settings, "metrics_port": free_port()})  # resumes after epoch 2
    assert [s["pets_step"] for s in second] == [9.0, 10.0, 11.0, 12.0]
    assert {s["pets_checkpoint_epoch"] for s in second} == {2.0}
    assert {s["pets_epoch"] for s in second} == {2.0}  # the resumed history's last epoch
    assert {s["pets_resume_step"] for s in second} == {8.0}
    assert second[0]["pets_restore_seconds"] > 0  # found epoch_2 and loaded it
    assert read_jsonl(tmp_path / "progress.jsonl")[-1]["epoch"] == 3
