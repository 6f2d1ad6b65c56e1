"""The trainer's MLflow run against a real tracking server (`mlflow server`, SQLite backend, artifacts in a
temporary directory, on a free loopback port), read back through MLflow's own client: one run with the
params, every epoch's accuracy, the model and summary as artifacts, status FINISHED, continued by the
attempt after a restart. And a server that is down or never answers: the training succeeds, with one
warning, and the summary says so."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from polling import wait_for

from pets_contract import env as contract_env
from pets_contract import tracking as keys
from pets_contract.names import MLFLOW_RUN_FILE
from pets_training.tracking import HTTP_BOUNDS, write_run

from .helpers import BIN, PYTHON, SMALL_ARGS, closed_port, free_port, read_json, read_jsonl, run

pytestmark = pytest.mark.unit

ARGS = [*SMALL_ARGS, "--threads", "1", "--num-workers", "0", "--tracking-log-steps", "8"]
TRAINING = {contract_env.TRAINING_NAMESPACE: "team-a", contract_env.TRAINING_NAME: "pets",
            contract_env.TRAINING_UID: "0f6c-uid"}


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLflow tracking server; its URL."""
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (root / "server.log").open("w")
    server = subprocess.Popen(
        [str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
         "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, cwd=root)
    try:
        wait_for(f"mlflow server on {url} (log: {root / 'server.log'})",
                 lambda: server.poll() is not None or _healthy(url), timeout=120, interval=0.5)
        assert server.poll() is None, (root / "server.log").read_text()[-3000:]
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


@pytest.mark.timeout(400)
def test_one_mlflow_run_holds_the_training_and_a_restart_continues_it(mlflow_server: str, tmp_path: Path
                                                                      ) -> None:
    out = tmp_path / "out"
    train = [PYTHON, "-m", "pets_training", *ARGS, "--output-dir", str(out), "--mlflow-uri", mlflow_server,
             "--mlflow-experiment", "pets-test"]
    # the first attempt stops after epoch 1 (as a preempted pod would); the next resumes (pets-launch's way)
    run([*train, "--max-epochs-this-run", "1"], timeout=180, env=TRAINING)
    first = read_json(out / MLFLOW_RUN_FILE)["run_id"]
    client = MlflowClient(mlflow_server)
    assert client.get_run(first).info.status == "KILLED"  # ended, not finished: a later attempt continues it
    output, _ = run([*train, "--resume"], timeout=180, env=TRAINING)
    assert f"continuing run {first}" in output

    experiment = client.get_experiment_by_name("pets-test")
    (listed,) = client.search_runs([experiment.experiment_id])  # one run, not one per attempt
    got = client.get_run(first)
    assert listed.info.run_id == first and got.info.status == "FINISHED"
    params = got.data.params
    assert (params["model"], params["epochs"], params["world_size"]) == ("resnet10t", "3", "1")
    assert params["mlflow_uri"] == mlflow_server
    history = client.get_metric_history(first, keys.EVAL_ACCURACY)
    progress = read_jsonl(out / "progress.jsonl")
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(
        [r["eval_accuracy"] for r in progress])
    assert len(history) == 3 and len(progress) == 3
    assert len(client.get_metric_history(first, keys.LOSS)) == 48 // 8
    files = {a.path for a in client.list_artifacts(first)}
    assert files >= {"model.safetensors", "summary.json", "config.yaml", "progress.jsonl"}, files
    model = Path(client.download_artifacts(first, "model.safetensors", str(tmp_path)))
    assert model.read_bytes() == (out / "model.safetensors").read_bytes()
    tags = got.data.tags
    assert [tags[key] for key in (keys.TAG_NAMESPACE, keys.TAG_NAME, keys.TAG_UID)] == ["team-a", "pets",
                                                                                       "0f6c-uid"]
    assert tags["mlflow.runName"] == "pets"
    tracked = read_json(out / "summary.json")["tracking"]
    assert tracked[keys.MLFLOW_RUN_ID] == first and tracked[keys.OK] is True
    page = f"{mlflow_server}/#/experiments/{experiment.experiment_id}/runs/{first}"
    assert tracked[keys.MLFLOW_URL] == page


@pytest.mark.timeout(300)
def test_a_run_the_server_no_longer_has_is_replaced_by_a_new_one(mlflow_server: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    gone = "0" * 32  # kept by an attempt against a server whose database was since made anew
    write_run(out, mlflow_server, None, "0", gone)
    run([PYTHON, "-m", "pets_training", *ARGS, "--epochs", "1", "--no-checkpoints", "--resume",
         "--output-dir", str(out), "--mlflow-uri", mlflow_server], timeout=180)
    tracked = read_json(out / "summary.json")["tracking"]
    assert tracked[keys.OK] is True and tracked[keys.MLFLOW_RUN_ID] not in (None, gone)
    assert MlflowClient(mlflow_server).get_run(tracked[keys.MLFLOW_RUN_ID]).info.status == "FINISHED"
    assert read_json(out / MLFLOW_RUN_FILE)["run_id"] == tracked[keys.MLFLOW_RUN_ID]


class Silent:
    """A server that takes connections and never answers: a hung tracking server."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("server", ["refusing", "silent"])
def test_a_tracking_server_down_or_hung_never_fails_the_training(server: str, tmp_path: Path) -> None:
    silent = Silent() if server == "silent" else None
    url = silent.url if silent else f"http://127.0.0.1:{closed_port()}"
    out = tmp_path / "out"
    start = time.monotonic()
    try:
        output, _ = run([PYTHON, "-m", "pets_training", *ARGS, "--epochs", "2", "--no-checkpoints",
                         "--output-dir", str(out), "--mlflow-uri", url, "--tracking-timeout", "5"],
                        timeout=240)
    finally:
        if silent:
            silent.sock.close()
    seconds = time.monotonic() - start
    summary = read_json(out / "summary.json")
    assert summary["status"] == "succeeded" and summary["epochs"] == 2
    tracked = summary["tracking"]
    assert tracked[keys.OK] is False and tracked[keys.MLFLOW_RUN_ID] is None and tracked[keys.WARNING]
    warnings = [line for line in output.splitlines() if " WARNING " in line]
    assert len(warnings) == 1 and "MLflow tracking at" in warnings[0], warnings  # one line, no retry noise
    # the loop never waited for it: a hung server holds each request 10 s, 3 tries, and the run takes a few
    # seconds; the process waited at most --tracking-timeout (5 s) for it at the end (60 s: imports, setup)
    hung = 3 * int(HTTP_BOUNDS["MLFLOW_HTTP_REQUEST_TIMEOUT"])
    assert summary["elapsed_seconds"] < hung and seconds < summary["elapsed_seconds"] + 5 + 60, seconds
