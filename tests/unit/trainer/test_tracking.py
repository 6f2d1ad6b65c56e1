"""The trainer's trackers (docs/watching.md): TensorBoard event files from the real trainer, read back with
TensorBoard's own reader; the pure parts of MLflow's (run file, tags, hyperparameters, the URI's rules).
The MLflow runs against a real tracking server are in test_tracking_mlflow.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
from tensorboard.plugins.hparams import plugin_data_pb2

from pets_contract import env as contract_env
from pets_contract import tracking as keys
from pets_contract.names import MLFLOW_RUN_FILE, TENSORBOARD_DIR
from pets_training import tracking
from pets_training.config import ConfigError, resolve

from .helpers import PYTHON, SMALL_ARGS, read_json, read_jsonl, run

pytestmark = pytest.mark.unit

# the small recipe, 3 epochs of 16 steps, a point every 4 steps
ARGS = [*SMALL_ARGS, "--threads", "1", "--num-workers", "0", "--no-checkpoints", "--tracking-log-steps", "4"]


def _scalars(logdir: Path) -> tuple[dict[str, list[tuple[int, float]]], dict[str, object]]:
    """The scalars of the run in ``logdir`` by tag, as (step, value), and its hyperparameters: what
    TensorBoard's own reader (the one its server uses) finds in the event files."""
    runs = EventMultiplexer().AddRunsFromDirectory(str(logdir))
    runs.Reload()
    main = runs.GetAccumulator(".")
    scalars = {tag: [(e.step, e.value) for e in main.Scalars(tag)] for tag in main.Tags()["scalars"]}
    hparams: dict[str, object] = {}
    for content in runs.PluginRunToTagToContent("hparams").values():
        for tag, blob in content.items():
            if tag.endswith("session_start_info"):
                info = plugin_data_pb2.HParamsPluginData.FromString(blob).session_start_info
                for name, value in info.hparams.items():
                    hparams[name] = getattr(value, value.WhichOneof("kind"))
    return scalars, hparams


def test_the_trainer_writes_tensorboard_events_its_reader_shows(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run([PYTHON, "-m", "pets_training", *ARGS, "--output-dir", str(out)], timeout=180)
    scalars, hparams = _scalars(out / TENSORBOARD_DIR)
    progress = read_jsonl(out / "progress.jsonl")
    steps_per_epoch = 256 // 16  # 4 classes x 80 images, 80 % for training, batch 16

    assert set(scalars) == {*keys.STEP_SCALARS, *keys.EPOCH_SCALARS}
    for tag in keys.STEP_SCALARS:  # every 4th step of the 48
        assert [step for step, _ in scalars[tag]] == list(range(4, 3 * steps_per_epoch + 1, 4)), tag
    assert all(value > 0 for _, value in scalars[keys.IMAGES_PER_SECOND])
    # the learning rate follows OneCycle: it rises to lr (0.03) and falls again
    rates = [value for _, value in scalars[keys.LEARNING_RATE]]
    assert max(rates) <= 0.03 + 1e-6 and rates[0] < max(rates) and rates[-1] < max(rates)
    # per epoch, at the epoch's last step: exactly the figures of progress.jsonl
    assert [step for step, _ in scalars[keys.EVAL_ACCURACY]] == [steps_per_epoch * e for e in (1, 2, 3)]
    for tag, key in ((keys.EVAL_ACCURACY, "eval_accuracy"), (keys.EPOCH_TRAIN_LOSS, "train_loss")):
        assert [v for _, v in scalars[tag]] == pytest.approx([r[key] for r in progress]), tag
    # the resolved config as hyperparameters
    assert hparams["model"] == "resnet10t" and hparams["image_size"] == 64 and hparams["world_size"] == 1
    assert hparams["resolved_mixed_precision"] == "bf16"
    summary = read_json(out / "summary.json")
    assert summary["tracking"] == {keys.TENSORBOARD: str(out / TENSORBOARD_DIR)}


def test_a_resumed_run_tells_tensorboard_to_drop_what_the_run_before_logged_past_its_resume_step(
        tmp_path: Path) -> None:
    """purge_step: TensorBoard's reader drops the earlier run's points at and after the step this run
    resumed at, which it logs again."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out = tmp_path / "out"
    args = [PYTHON, "-m", "pets_training", *(a for a in ARGS if a != "--no-checkpoints"),
            "--output-dir", str(out)]
    run([*args, "--max-train-steps", "24"], timeout=180)
    run([*args, "--resume"], timeout=180)
    resumed = read_json(out / "summary.json")["resume_step"]
    _, second = sorted((out / TENSORBOARD_DIR).glob("events.out.tfevents.*"))  # one a run, by its start
    starts = [event.step for event in EventFileLoader(str(second)).Load()
              if event.HasField("session_log") and event.session_log.status == event.session_log.START]
    assert resumed > 0 and starts == [resumed], (resumed, starts)


def test_no_tensorboard_writes_no_events(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run([PYTHON, "-m", "pets_training", *ARGS, "--epochs", "1", "--no-tensorboard", "--output-dir", str(out)],
        timeout=180)
    assert not (out / TENSORBOARD_DIR).exists()
    assert read_json(out / "summary.json")["tracking"] == {}


def test_a_tracking_uri_with_credentials_is_refused_naming_where_they_go() -> None:
    with pytest.raises(ConfigError) as err:
        resolve(["--mlflow-uri", "https://alice:s3cret@mlflow.example:5000"])
    assert "MLFLOW_TRACKING_USERNAME" in str(err.value) and "s3cret" not in str(err.value)
    bad = (("--tracking-log-steps", "0"), ("--tracking-timeout", "0"), ("--mlflow-experiment", " "))
    for flag, value in bad:
        with pytest.raises(ConfigError, match=flag.lstrip("-").replace("-", "_")):
            resolve([flag, value])


def test_the_run_file_is_kept_per_server_and_training(tmp_path: Path) -> None:
    uri = "http://mlflow.tracking.svc:5000"
    assert tracking.read_run(tmp_path, uri, None) is None  # no file: a new run
    tracking.write_run(tmp_path, uri, "uid-1", "3", "abc")
    assert json.loads((tmp_path / MLFLOW_RUN_FILE).read_text())["run_id"] == "abc"
    assert tracking.read_run(tmp_path, uri, "uid-1") == "abc"
    assert tracking.read_run(tmp_path, uri, None) == "abc"  # the uid unknown: the file's run
    assert tracking.read_run(tmp_path, "http://other:5000", "uid-1") is None  # another server
    assert tracking.read_run(tmp_path, uri, "uid-2") is None  # another training on a kept claim
    (tmp_path / MLFLOW_RUN_FILE).write_text("{not json")
    assert tracking.read_run(tmp_path, uri, "uid-1") is None


def test_tags_name_the_training_and_hparams_hold_no_secret() -> None:
    env = {contract_env.TRAINING_NAMESPACE: "team-a", contract_env.TRAINING_NAME: "pets",
           contract_env.TRAINING_UID: "1234", "OTHER": "x"}
    assert tracking.training_tags(env) == {keys.TAG_NAMESPACE: "team-a", keys.TAG_NAME: "pets",
                                           keys.TAG_UID: "1234"}
    assert tracking.training_tags({}) == {}
    cfg = resolve(["--data", "https://bucket.example/pets.tar?X-Amz-Signature=secret", "--mlflow-uri",
                   "http://mlflow:5000"])
    values = tracking.hparams(cfg, 4, "bf16")
    assert "secret" not in json.dumps(values) and values["world_size"] == 4
    assert None not in values.values() and "weights" not in values  # unset: left out
    assert tracking.run_url("http://mlflow:5000/", "1", "r") == "http://mlflow:5000/#/experiments/1/runs/r"
    assert tracking.run_url("file:///tmp/mlruns", "1", "r") is None


def test_mlflows_http_waits_are_bounded_unless_the_environment_says_otherwise() -> None:
    env = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "60"}
    tracking.bound_http(env)
    assert env == {"MLFLOW_HTTP_REQUEST_TIMEOUT": "60", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                   "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}


def test_mlflow_is_on_with_the_flag_or_mlflows_own_env(tmp_path: Path) -> None:
    def names(argv: list[str], env: dict[str, str]) -> list[str]:
        made = tracking.log_with(resolve(argv), tmp_path, env)
        return [t if isinstance(t, str) else f"mlflow {t.uri}" for t in made]

    assert names([], {}) == ["tensorboard"]
    assert names(["--no-tensorboard"], {}) == []
    assert names(["--mlflow-uri", "http://a:5000"], {"MLFLOW_TRACKING_URI": "http://b:5000"}) == [
        "tensorboard", "mlflow http://a:5000"]  # the flag wins
    assert names([], {"MLFLOW_TRACKING_URI": "http://b:5000"}) == ["tensorboard", "mlflow http://b:5000"]
