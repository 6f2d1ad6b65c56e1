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

from .helpers import free_port, read_jsonl

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
