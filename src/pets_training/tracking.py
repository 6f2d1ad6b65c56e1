"""The run's trackers, through Accelerate's own (docs/watching.md): TensorBoard event files from rank 0
under <output>/tensorboard, and an MLflow run when a tracking server is named (``--mlflow-uri``).

A tracking server never fails or slows the training. MLflow's calls run in order on one background
thread (:class:`MLflowGuard`) with bounded HTTP retries and timeouts; the first one that fails logs one
warning, sets the ``tracking_failures`` gauge and the summary's ``tracking.ok`` to false, and the run's
later MLflow calls are dropped. Only the end of the run waits for it, at most ``--tracking-timeout``
seconds. The run's id is kept in <output>/mlflow-run.json, so an attempt after a restart continues it.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from accelerate import Accelerator
from accelerate.tracking import GeneralTracker

from pets_contract import env as contract_env
from pets_contract import tracking as keys
from pets_contract.names import MLFLOW_RUN_FILE, TENSORBOARD_DIR
from pets_contract.redact import redact_urls

from .config import TrainConfig

log = logging.getLogger("pets_training")

# MLflow's HTTP client waits 120 s a request and retries 7 times by default: minutes on a dead server.
# Set where the environment does not: a request fails within about 35 s (3 tries of 10 s, 1 s + 2 s apart).
HTTP_BOUNDS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
}
MAX_PENDING = 1000  # calls waiting for a slow server: beyond this it counts as failed
WARNING_CHARS = 300  # the summary holds 4 KiB
FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"  # MLflow's run statuses at the end of a run
# A run stopped by SIGTERM waits this long at most for the status: the stop must fit in the pod's grace
# period (30 s by default) with the step and its checkpoint; a later attempt continues the run anyway.
SHORT_WAIT = 2.0


THREAD = "mlflow-tracker"


def bound_http(env: MutableMapping[str, str]) -> None:
    for name, value in HTTP_BOUNDS.items():
        env.setdefault(name, value)


class _NotFromTracker(logging.Filter):
    """urllib3's "Retrying ..." lines from the tracker's thread: its failure is told once, by the tracker."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != THREAD


_QUIET = _NotFromTracker()  # one instance: adding it again is a no-op


def hparams(cfg: TrainConfig, world_size: int, mixed_precision: str) -> dict[str, Any]:
    """The resolved config as the trackers' hyperparameters: unset fields left out, URLs redacted."""
    values: dict[str, Any] = {"world_size": world_size, "resolved_mixed_precision": mixed_precision}
    for name, value in cfg.to_dict().items():
        if value is not None:
            values[name] = redact_urls(value) if isinstance(value, str) else value
    return values


def training_tags(env: Mapping[str, str]) -> dict[str, str]:
    """The MLflow run's tags naming the PetsTraining, from the env the operator gives its pods."""
    pairs = ((keys.TAG_NAMESPACE, contract_env.TRAINING_NAMESPACE),
             (keys.TAG_NAME, contract_env.TRAINING_NAME), (keys.TAG_UID, contract_env.TRAINING_UID))
    return {tag: env[name] for tag, name in pairs if env.get(name)}


def run_url(uri: str, experiment_id: str, run_id: str) -> str | None:
    """The run's page in MLflow's UI, for an HTTP tracking server."""
    if urlsplit(uri).scheme not in ("http", "https"):
        return None
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def read_run(output_dir: Path, uri: str, uid: str | None) -> str | None:
    """The id of the MLflow run this training logged to before (a restart continues it): only one kept for
    the same tracking server and, when known, the same training (uid); else None."""
    try:
        kept = json.loads((output_dir / MLFLOW_RUN_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("tracking_uri") != redact_urls(uri):
        return None
    if uid and kept.get("training_uid") not in (None, uid):
        return None
    run_id = kept.get("run_id")
    return run_id if isinstance(run_id, str) and run_id else None


def write_run(output_dir: Path, uri: str, uid: str | None, experiment_id: str, run_id: str) -> None:
    record = {"tracking_uri": redact_urls(uri), "training_uid": uid, "experiment_id": experiment_id,
              "run_id": run_id}
    tmp = output_dir / f".{MLFLOW_RUN_FILE}.tmp"
    tmp.write_text(json.dumps(record) + "\n")
    tmp.replace(output_dir / MLFLOW_RUN_FILE)


def one_line(err: BaseException | str, uri: str) -> str:
    text = " ".join(str(err).split())
    if not isinstance(err, str):
        text = f"{type(err).__name__}: {text}"
    return redact_urls(text, uri)[:WARNING_CHARS]


class MLflowGuard(GeneralTracker):
    """Accelerate's MLflowTracker, its calls run in order on a background thread of rank 0. The first call
    that raises (or a queue of MAX_PENDING) ends it with one warning; the training waits for it only in
    :meth:`close`, at most ``timeout`` seconds."""

    name = "mlflow"
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, uri: str, experiment: str, output_dir: Path, resume: bool, env: Mapping[str, str],
                 timeout: float) -> None:
        super().__init__()
        self.uri, self.experiment, self.output_dir, self.resume = uri, experiment, output_dir, resume
        self.tags = training_tags(env)
        self.uid = env.get(contract_env.TRAINING_UID) or None
        self.run_name = env.get(contract_env.TRAINING_NAME) or None
        self.timeout = timeout
        self.inner: Any = None  # accelerate's MLflowTracker, made on the worker thread
        self.jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.thread: threading.Thread | None = None
        self.warning = ""
        self.closed = False
        self.continued = False
        self.run_id = self.url = ""
        self.on_failure: Callable[[], None] | None = None

    @property
    def tracker(self) -> Any:
        return self.inner

    def start(self) -> None:
        bound_http(os.environ)
        logging.getLogger("urllib3.connectionpool").addFilter(_QUIET)
        self.thread = threading.Thread(target=self._work, name=THREAD, daemon=True)
        self.thread.start()
        self._put(self._open)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self._put(lambda: self._params(values))

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self._put(lambda: self.inner.log(values, step=step))

    def finish(self) -> None:  # accelerator.end_training(): a run not closed before ends as accelerate's does
        self.close(FINISHED, [])

    def close(self, status: str, artifacts: Sequence[Path], wait: float | None = None) -> dict[str, Any]:
        """Upload ``artifacts`` and end the run with ``status``; wait at most ``wait`` s for the server
        (default and most: ``timeout``)."""
        if self.closed or self.thread is None:
            return self.report()
        for path in artifacts:
            if path.is_file():
                self._put(self._upload(path))
        self._put(lambda: self._end(status))
        self.closed = True
        self.jobs.put(None)
        wait = self.timeout if wait is None else min(wait, self.timeout)
        self.thread.join(wait)
        if self.thread.is_alive():
            self._fail(f"no answer within {wait:g} s at the end of the run")
        return self.report()

    def report(self) -> dict[str, Any]:
        return {keys.MLFLOW_RUN_ID: self.run_id or None, keys.MLFLOW_URL: self.url or None,
                keys.OK: not self.warning, keys.WARNING: self.warning or None}

    def _put(self, job: Callable[[], None]) -> None:
        if self.warning or self.closed:
            return
        if self.jobs.qsize() >= MAX_PENDING:
            self._fail(f"{MAX_PENDING} calls waiting: the server is too slow")
            return
        self.jobs.put(job)

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            if self.warning:
                continue  # drained: nothing more is sent once it failed
            try:
                job()
            except Exception as err:  # any failure of the server or the client: never the training's
                self._fail(err)

    def _fail(self, err: BaseException | str) -> None:
        if self.warning:
            return
        self.warning = one_line(err, self.uri)
        log.warning("MLflow tracking at %s failed, the training goes on without it: %s",
                    redact_urls(self.uri), self.warning)
        if self.on_failure is not None:
            self.on_failure()

    def _open(self) -> None:
        import mlflow
        from accelerate.tracking import MLflowTracker
        from mlflow.exceptions import MlflowException

        mlflow.set_tracking_uri(self.uri)
        previous = read_run(self.output_dir, self.uri, self.uid) if self.resume else None
        self.inner = MLflowTracker(experiment_name=self.experiment, run_id=previous, tags=self.tags or None,
                                   run_name=self.run_name)
        try:
            self.inner.start()
        except MlflowException as err:
            if previous is None or err.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            log.info("MLflow run %s is gone from the server: starting a new one", previous)
            self.inner.run_id = previous = None
            self.inner.start()
        info = self.inner.active_run.info
        self.run_id, self.continued = info.run_id, previous is not None
        self.url = run_url(self.uri, info.experiment_id, info.run_id) or ""
        write_run(self.output_dir, self.uri, self.uid, info.experiment_id, info.run_id)
        log.info("MLflow: %s run %s of experiment %r%s", "continuing" if self.continued else "started",
                 self.run_id, self.experiment, f" ({redact_urls(self.url)})" if self.url else "")

    def _params(self, values: dict[str, Any]) -> None:
        """A continued run keeps the params it has: MLflow refuses to change one."""
        if self.continued:
            import mlflow

            have = mlflow.get_run(self.run_id).data.params
            values = {k: v for k, v in values.items() if k not in have}
        if values:
            self.inner.store_init_configuration(values)

    def _upload(self, path: Path) -> Callable[[], None]:
        return lambda: self.inner.log_artifact(str(path))

    def _end(self, status: str) -> None:
        import mlflow

        mlflow.end_run(status=status)


def log_with(cfg: TrainConfig, output_dir: Path, env: Mapping[str, str]) -> list[Any]:
    """``Accelerator(log_with=...)``: TensorBoard (unless ``--no-tensorboard``), and MLflow with
    ``--mlflow-uri`` or MLflow's own MLFLOW_TRACKING_URI (a pod's spec.env can set it, from a Secret too)."""
    trackers: list[Any] = ["tensorboard"] if cfg.tensorboard else []
    uri = cfg.mlflow_uri or env.get("MLFLOW_TRACKING_URI")
    if uri:
        trackers.append(MLflowGuard(uri, cfg.mlflow_experiment, output_dir, cfg.resume, env,
                                    cfg.tracking_timeout))
    return trackers


class RunTrackers:
    """The trackers of one run, as the training loop uses them; every call is a no-op but on rank 0 with a
    tracker on. Scalars go through ``accelerator.log`` (pets_contract.tracking names them)."""

    def __init__(self, accelerator: Accelerator, cfg: TrainConfig, output_dir: Path) -> None:
        self.accelerator = accelerator
        self.on = accelerator.is_main_process and bool(accelerator.log_with)
        self.every = cfg.tracking_log_steps
        self.output_dir = output_dir
        self.tensorboard = cfg.tensorboard
        self.mlflow = next((t for t in accelerator.log_with if isinstance(t, MLflowGuard)), None)
        self.window_start = time.perf_counter()
        self.window_images = 0

    def start(self, cfg: TrainConfig, resumed_step: int, on_failure: Callable[[], None] | None) -> None:
        """Open the runs, the resolved config as hyperparameters; a resumed run's TensorBoard hides the
        steps at and after ``resumed_step`` that the attempt before logged (purge_step)."""
        if not self.on:
            return
        if self.mlflow is not None:
            self.mlflow.on_failure = on_failure
        init = {"tensorboard": {"purge_step": resumed_step}} if resumed_step else {}
        config = hparams(cfg, self.accelerator.num_processes, str(self.accelerator.mixed_precision))
        self.accelerator.init_trackers(TENSORBOARD_DIR, config=config, init_kwargs=init)
        self.window_start = time.perf_counter()

    def step(self, step: int, loss: Any, images: int, lr: float) -> None:
        """After each training step; every ``--tracking-log-steps`` the loss (a device sync), the learning
        rate and the images/s since the last point."""
        self.window_images += images
        if not self.on or step % self.every:
            return
        now = time.perf_counter()
        rate = self.window_images / max(now - self.window_start, 1e-9)
        self.accelerator.log({keys.LOSS: float(loss), keys.LEARNING_RATE: lr, keys.IMAGES_PER_SECOND: rate},
                             step=step)
        self.window_start, self.window_images = now, 0

    def epoch(self, record: Mapping[str, Any], step: int) -> None:
        if self.on:
            self.accelerator.log({keys.EVAL_ACCURACY: record["eval_accuracy"],
                                  keys.EPOCH_TRAIN_LOSS: record["train_loss"],
                                  keys.EPOCH_IMAGES_PER_SECOND: record["images_per_second"],
                                  keys.EPOCH: record["epoch"]}, step=step)
        self.window_start, self.window_images = time.perf_counter(), 0  # eval is not in the next window

    def close(self, status: str, artifacts: Sequence[Path] = (), wait: float | None = None) -> dict[str, Any]:
        """End the MLflow run (FINISHED, FAILED or KILLED: stopped or paused, a later attempt continues it),
        waiting at most ``wait`` s (default: ``--tracking-timeout``); returns the summary's ``tracking``."""
        report: dict[str, Any] = {}
        if self.tensorboard:
            report[keys.TENSORBOARD] = str(self.output_dir / TENSORBOARD_DIR)
        if self.mlflow is not None and self.on:
            report.update(self.mlflow.close(status, artifacts, wait))
        return report
