"""`kubectl pets plot` from a progress.jsonl, the list table, the argument parser, the notebook."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pets_client import cli
from pets_client.errors import PetsClientError
from pets_client.plot import PlotUnavailableError, plot_progress, read_progress

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
NOTEBOOK = REPO / "examples" / "train-from-python.ipynb"

PROGRESS = "\n".join(json.dumps(r) for r in [
    {"epoch": 1, "total_epochs": 3, "train_loss": 1.9, "eval_accuracy": 0.3, "images_per_second": 50.0},
    {"epoch": 2, "total_epochs": 3, "train_loss": 1.5, "eval_accuracy": 0.4, "images_per_second": 51.0},
    {"epoch": 2, "total_epochs": 3, "train_loss": 1.4, "eval_accuracy": 0.45, "images_per_second": 52.0},
    {"epoch": 3, "total_epochs": 3, "train_loss": 1.1, "eval_accuracy": 0.6, "images_per_second": 50.5},
]) + '\n{"epoch": 4, "train_lo'  # a run killed mid-write


def test_read_progress_keeps_the_last_record_of_each_epoch() -> None:
    records = read_progress(PROGRESS)
    assert [r["epoch"] for r in records] == [1, 2, 3]
    assert records[1]["train_loss"] == 1.4, "a resumed run's repeated epoch keeps the newest"


def test_plot_writes_a_png(tmp_path: Path) -> None:
    out = plot_progress(read_progress(PROGRESS), tmp_path / "sub" / "curves.png", title="pets")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    from PIL import Image

    with Image.open(out) as img:
        assert img.size == (900, 350)


def test_plot_without_records_or_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(PetsClientError, match="no epoch records"):
        plot_progress([], tmp_path / "x.png")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PlotUnavailableError, match="pip install matplotlib"):
        plot_progress(read_progress(PROGRESS), tmp_path / "x.png")


def test_list_table() -> None:
    items = [
        {"metadata": {"name": "pets", "creationTimestamp": "2020-01-01T00:00:00Z"},
         "spec": {"replicas": 2, "epochs": 5},
         "status": {"phase": "Running", "epoch": 1, "totalEpochs": 5, "evalAccuracy": 0.41234}},
        {"metadata": {"name": "new-one"}, "spec": {"replicas": 1}},
    ]
    lines = cli.table(items).splitlines()
    assert lines[0].split() == ["NAME", "PHASE", "REPLICAS", "EPOCH", "ACCURACY", "AGE"]
    assert lines[1].split()[:5] == ["pets", "Running", "2", "1/5", "0.4123"]
    assert lines[1].split()[5].endswith("d")
    assert lines[2].split() == ["new-one", "-", "1", "-", "-", "?"]


def test_parser_takes_namespace_before_or_after_the_command() -> None:
    p = cli.parser()
    args = p.parse_args(["-n", "a", "run", "-f", "x.yaml", "--watch"])
    assert (args.command, args.namespace, args.filename, args.watch) == ("run", "a", "x.yaml", True)
    args = p.parse_args(["logs", "pets", "--rank", "1", "-f", "--namespace", "b", "--kubeconfig", "k"])
    assert (args.name, args.rank, args.follow, args.namespace, args.kubeconfig) == ("pets", 1, True, "b", "k")
    assert not hasattr(p.parse_args(["list"]), "namespace")
    with pytest.raises(SystemExit) as err:
        p.parse_args(["run"])
    assert err.value.code == 2


def test_cli_reports_a_missing_kubeconfig(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list", "--kubeconfig", str(tmp_path / "nope")]) == 1
    assert "no Kubernetes credentials" in capsys.readouterr().err


def test_the_notebook_is_valid_and_parameterised() -> None:
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.get("outputs") for c in code), "commit the notebook without outputs"
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1
    for var in ("PETS_NAMESPACE", "PETS_OUTPUT_CLAIM"):
        assert var in params[0].source
    source = "\n".join(c.source for c in code)
    assert "PetsTrainingClient" in source and "IPython.display" in source and "metrics.png" in source
    for c in code:
        compile(c.source, "cell", "exec")
