"""PetsTrainingClient: create, watch, inspect and collect PetsTrainings from Python.

Only the kubernetes client, PyYAML and tqdm: no torch, so a notebook without the trainer's stack can
drive trainings on a cluster. Everything goes through the API server with the caller's own
credentials (a kubeconfig, or a pod's service account).
"""

from __future__ import annotations

import builtins
import copy
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from . import _api
from . import upload as up
from .errors import (
    FetchError,
    InvalidTrainingError,
    LogsError,
    PetsClientError,
    TrainingDeletedError,
    UploadError,
    WaitTimeoutError,
    terminal_text,
)
from .files import FETCH_POD_START_S, auto_tqdm
from .progress import BarState, bar_state, dataset_line, final_line, phase_line
from .serve import ServeMixin

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
WATCH_CHUNK_S = 300  # one watch request at most this long; then it resumes from the last resourceVersion


# ----------------------------------------------------------------------------- pure helpers


def _camel(key: str) -> str:
    """batch_size -> batchSize, so Python keyword arguments can use either spelling."""
    head, *rest = key.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def build_training(spec: dict[str, Any] | None = None, *, name: str | None = None,
                   namespace: str | None = None, **fields: Any) -> dict[str, Any]:
    """The PetsTraining to create, from a spec dict or a whole manifest, plus keyword fields.

    ``spec`` may be a spec (``{"epochs": 2}``) or a manifest (``apiVersion``/``kind``/``metadata``/``spec``,
    as in a YAML file). ``fields`` override spec fields (``batch_size`` and ``batchSize`` both work).
    Without a name, the server picks one from ``generateName: pets-``.
    """
    given = copy.deepcopy(spec) if spec else {}
    if not isinstance(given, dict):
        raise InvalidTrainingError(f"a PetsTraining spec must be a mapping, not {type(given).__name__}")
    if {"spec", "kind", "apiVersion", "metadata"} & given.keys():
        for key, want in (("kind", _api.KIND), ("apiVersion", _api.API_VERSION)):
            if (got := given.get(key, want)) != want:
                raise InvalidTrainingError(f"{key}: expected {want}, got {got!r}", fields=[key])
        body = given
        if body.get("spec") is None:  # missing, or `spec:` with nothing under it
            body["spec"] = {}
    else:
        body = {"spec": given}
    body["apiVersion"], body["kind"] = _api.API_VERSION, _api.KIND
    metadata = body.setdefault("metadata", {}) or {}
    body["metadata"] = metadata
    body["spec"].update({_camel(k): v for k, v in fields.items()})
    if namespace and metadata.get("namespace") not in (None, namespace):
        raise InvalidTrainingError(
            f"metadata.namespace: the manifest says {metadata['namespace']!r} but the client works in "
            f"{namespace!r}: drop it from the manifest or use PetsTrainingClient(namespace=...)",
            fields=["metadata.namespace"])
    if name:
        metadata["name"] = name
        metadata.pop("generateName", None)
    elif not metadata.get("name") and not metadata.get("generateName"):
        metadata["generateName"] = _api.GENERATE_NAME
    return body


def pod_selector(children: dict[str, Any], rank: int) -> str:
    """The label selector of the pod of ``rank`` of a training's current workload (status.children)."""
    if rank < 0:
        raise LogsError(f"rank must be 0 or more, got {rank}")
    if children.get("job"):
        return f"{_api.JOB_NAME_LABEL}={children['job']},{_api.JOB_INDEX_LABEL}={rank}"
    if children.get("pytorchJob"):
        # The Master is rank 0, Worker i is rank i + 1 (as the training-operator sets RANK).
        kind, index = ("master", 0) if rank == 0 else ("worker", rank - 1)
        return (f"{_api.KUBEFLOW_JOB_NAME_LABEL}={children['pytorchJob']},"
                f"{_api.KUBEFLOW_REPLICA_TYPE_LABEL}={kind},{_api.KUBEFLOW_REPLICA_INDEX_LABEL}={index}")
    raise LogsError("the training has no workload yet (status.children is empty): the operator has "
                    "not created its Job; is the operator running?")


# ----------------------------------------------------------------------------- credentials


def _load_api_client(kubeconfig: str | os.PathLike[str] | None,
                     context: str | None) -> tuple[Any, str | None]:
    """An ApiClient and the namespace of the kubeconfig context (or of the pod's service account)."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    path = str(kubeconfig) if kubeconfig else None
    default = os.environ.get("KUBECONFIG") or str(Path("~/.kube/config").expanduser())
    have_file = path is not None or any(Path(p).is_file() for p in default.split(os.pathsep) if p)
    if not have_file and os.environ.get("KUBERNETES_SERVICE_HOST"):
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)
        ns = SERVICE_ACCOUNT_NAMESPACE.read_text().strip() if SERVICE_ACCOUNT_NAMESPACE.is_file() else None
        return client.ApiClient(cfg), ns
    try:
        api_client = config.new_client_from_config(config_file=path, context=context)
        contexts, active = config.list_kube_config_contexts(config_file=path)
    except (ConfigException, OSError) as exc:
        raise PetsClientError(
            f"no Kubernetes credentials: could not load the kubeconfig {path or default} ({exc}); set "
            "KUBECONFIG or pass kubeconfig= (kubectl pets: --kubeconfig)") from exc
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else active
    ns = ((chosen or {}).get("context") or {}).get("namespace")
    return api_client, ns


# ----------------------------------------------------------------------------- the progress display


class _Reporter:
    """The live bar (tqdm.auto: a widget in notebooks, text elsewhere) and the phase/message lines."""

    def __init__(self, name: str, enabled: bool, file: IO[str] | None) -> None:
        self.name, self.enabled, self.file = name, enabled, file
        self.bar: Any = None
        self.last: dict[str, Any] | None = None

    def _new_bar(self, state: BarState) -> Any:
        # `initial`: the steps done before the bar appeared (a late watch, a resumed run) are not counted
        # in its rate, which then comes from the steps seen while it runs.
        return auto_tqdm()(total=state.total, initial=state.n, unit=state.unit, desc=self._desc(state),
                    file=self.file, dynamic_ncols=True, leave=True)

    def _desc(self, state: BarState) -> str:
        return terminal_text(f"{self.name} {state.desc}".strip())

    def update(self, status: dict[str, Any]) -> None:
        if self.enabled:
            for line in (phase_line(self.name, self.last, status),
                         dataset_line(self.name, self.last, status)):
                if line:
                    self.write(line)
            state = bar_state(status)
            if state.total is not None:
                if self.bar is None:
                    self.bar = self._new_bar(state)
                elif state.n >= self.bar.n:
                    self.bar.update(state.n - self.bar.n)
                else:  # a gang restart resumed from an earlier checkpoint: back, without a rate from it
                    self.bar.n = self.bar.last_print_n = state.n
                self.bar.set_description_str(self._desc(state), refresh=False)
                self.bar.set_postfix(state.postfix, refresh=False)
                self.bar.refresh()
        self.last = status

    def write(self, text: str) -> None:
        text = terminal_text(text)  # the status message is the cluster's text
        if self.bar is not None:
            self.bar.write(text, file=self.file)
        else:
            print(text, file=self.file or sys.stdout, flush=True)

    def close(self, status: dict[str, Any] | None) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.enabled and status is not None:
            print(terminal_text(final_line(self.name, status)), file=self.file or sys.stdout, flush=True)


# ----------------------------------------------------------------------------- the client


class PetsTrainingClient(ServeMixin):
    """PetsTrainings in one namespace.

    namespace: default the kubeconfig context's namespace (in a pod: its own), else "default".
    kubeconfig: a kubeconfig file; default $KUBECONFIG, ~/.kube/config, or the pod's service account.
    context: a kubeconfig context other than the current one.
    api_client: a ready kubernetes.client.ApiClient (then kubeconfig and context are not read).
    """

    def __init__(self, namespace: str | None = None, kubeconfig: str | os.PathLike[str] | None = None, *,
                 context: str | None = None, api_client: Any = None) -> None:
        from kubernetes import client

        api_client, context_ns = (_load_api_client(kubeconfig, context) if api_client is None
                                  else (api_client, None))
        self.api_client = api_client
        self.namespace: str = namespace or context_ns or "default"
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)

    def __repr__(self) -> str:
        return f"PetsTrainingClient(namespace={self.namespace!r})"

    def _custom(self, what: str, verb: str, *args: Any, **kwargs: Any) -> Any:
        """``<verb>_namespaced_custom_object`` on the namespace's PetsTrainings, through :meth:`_call`."""
        return self._call(what, getattr(self.custom, f"{verb}_namespaced_custom_object"), _api.GROUP,
                          _api.VERSION, self.namespace, _api.PLURAL, *args, **kwargs)

    # ------------------------------------------------------------------ CRUD

    def train(self, spec: dict[str, Any] | None = None, /, *, name: str | None = None,
              dataset_claim: str | None = None, dataset_path: str = "/", progress: bool = True,
              **fields: Any) -> str:
        """Create a PetsTraining and return its name.

        ``train(epochs=2, replicas=2)``, ``train({"epochs": 2})`` or ``train(manifest)`` (a dict loaded
        from a PetsTraining YAML); keyword fields override the dict's spec. The API server applies the
        defaults and validates: a refused spec raises InvalidTrainingError with the server's message,
        which names the field.

        ``dataset=DIR`` (a local folder, not a dict) uploads it first and trains on it: into
        ``dataset_claim`` (default ``<name>-data``; without a name one is picked here, ``pets-xxxxx``) at
        ``dataset_path``, with `upload` (made ReadWriteMany when replicas > 1, as the operator's
        output claims; the image is spec.image or the default trainer image), and sets
        spec.dataset.persistentVolumeClaim. The spec is checked by the server (a dry run) before the
        upload; the claim stays if the training is refused, so a second call resumes.
        """
        data_dir = fields.get("dataset")
        if isinstance(data_dir, str | os.PathLike):
            del fields["dataset"]
            return self._train_on(data_dir, spec, name, dataset_claim, dataset_path, progress, fields)
        if dataset_claim is not None or dataset_path != "/":
            raise UploadError("dataset_claim and dataset_path go with dataset=DIR (a local folder)")
        body = build_training(spec, name=name, namespace=self.namespace, **fields)
        return self._create(body)

    def _train_on(self, data_dir: str | os.PathLike[str], spec: dict[str, Any] | None, name: str | None,
                  claim: str | None, path: str, progress: bool, fields: dict[str, Any]) -> str:

        files = up.walk(data_dir)
        sub = up.claim_dir(path)
        body = build_training(spec, name=name, namespace=self.namespace, **fields)
        metadata = body["metadata"]
        if not metadata.get("name"):
            alphabet = "bcdfghjklmnpqrstvwxz2456789"  # the API server's generateName alphabet
            metadata["name"] = (metadata.pop("generateName", None) or _api.GENERATE_NAME) + "".join(
                secrets.choice(alphabet) for _ in range(5))
        claim = up.check_claim_name(claim or f"{metadata['name']}{up.DATA_CLAIM_SUFFIX}")
        body["spec"]["dataset"] = {"persistentVolumeClaim": {"claimName": claim,
                                                             "path": up.dataset_path(sub)}}
        body["metadata"].pop("namespace", None)
        self._custom("checking the PetsTraining (dry run)", "create", body, dry_run="All")
        train_spec = body["spec"]
        result = self._upload(files, claim, sub, image=str(train_spec.get("image") or _api.DEFAULT_IMAGE),
                              access_modes=up.data_access_modes(int(train_spec.get("replicas") or 1)),
                              storage_class=None, progress=progress, file=None, timeout=FETCH_POD_START_S,
                              scheduling=train_spec)
        if progress:
            print(result.summary(), flush=True)
        return self._create(body)

    def _create(self, body: dict[str, Any]) -> str:
        body["metadata"].pop("namespace", None)
        created = self._custom("creating the PetsTraining", "create", body)
        return str(created["metadata"]["name"])

    def get(self, name: str) -> dict[str, Any]:
        """The PetsTraining object (a dict)."""
        return self._custom(f"reading {name}", "get", name, name=name)  # type: ignore[no-any-return]

    def status(self, name: str) -> dict[str, Any]:
        """Its status (empty until the operator has written one)."""
        return self.get(name).get("status") or {}

    def list(self) -> builtins.list[dict[str, Any]]:
        """Every PetsTraining of the namespace, oldest first."""
        items = self._custom("listing PetsTrainings", "list")["items"]
        return sorted(items, key=lambda o: (o["metadata"].get("creationTimestamp") or "",
                                            o["metadata"]["name"]))

    def delete(self, name: str) -> None:
        """Delete it; its Job, Service and pods go with it (owner references)."""
        self._custom(f"deleting {name}", "delete", name, body={"propagationPolicy": "Background"}, name=name)

    def _set_suspend(self, name: str, value: bool) -> dict[str, Any]:
        return self._custom(f"patching {name}", "patch", name, {"spec": {"suspend": value}},  # type: ignore[no-any-return]
                            name=name)

    def suspend(self, name: str) -> None:
        """spec.suspend = true: the operator suspends the Job and its pods go."""
        self._set_suspend(name, True)

    def resume(self, name: str) -> None:
        """spec.suspend = false: the Job runs again."""
        self._set_suspend(name, False)

    # ------------------------------------------------------------------ wait

    def wait(self, name: str, timeout: float | None = None, progress: bool = True, *,
             file: IO[str] | None = None) -> dict[str, Any]:
        """Watch the training until it is Succeeded or Failed and return that final status.

        progress=True shows a live bar of steps (or epochs) with loss, accuracy and images/s, and prints
        the phase and the status message whenever they change (a Pending reason, a restart). It follows
        a watch on the PetsTraining (resumed from the last resourceVersion when the server ends it),
        not a polling loop. Raises WaitTimeoutError after ``timeout`` seconds (None: no limit).
        """
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        deadline = None if timeout is None else time.monotonic() + timeout
        reporter = _Reporter(name, progress, file)
        status: dict[str, Any] = {}

        def read() -> tuple[dict[str, Any], str]:  # the object afresh: its status and resourceVersion
            obj = self.get(name)
            reporter.update(obj.get("status") or {})
            return obj.get("status") or {}, obj["metadata"]["resourceVersion"]

        try:
            status, version = read()
            while status.get("phase") not in _api.FINISHED_PHASES:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise WaitTimeoutError(
                        f"{name} is still {status.get('phase') or 'without status'} after {timeout:g} s"
                        + (f": {terminal_text(status['message'])}" if status.get("message") else ""), status)
                chunk = WATCH_CHUNK_S if left is None else max(1, min(WATCH_CHUNK_S, int(left + 0.999)))
                w = watch.Watch()
                try:
                    for event in w.stream(self.custom.list_namespaced_custom_object, _api.GROUP, _api.VERSION,
                                          self.namespace, _api.PLURAL,
                                          field_selector=f"metadata.name={name}", resource_version=version,
                                          allow_watch_bookmarks=True, timeout_seconds=chunk,
                                          _request_timeout=chunk + 30):
                        kind, got = event["type"], event["object"]
                        meta = got.get("metadata") or {} if isinstance(got, dict) else {}
                        if meta.get("resourceVersion"):
                            version = meta["resourceVersion"]
                        if kind == "BOOKMARK":
                            continue
                        if kind == "DELETED":
                            raise TrainingDeletedError(f"{name} was deleted while waiting for it to finish")
                        status = got.get("status") or {}
                        reporter.update(status)
                        if status.get("phase") in _api.FINISHED_PHASES or (
                                deadline is not None and time.monotonic() >= deadline):
                            w.stop()
                            break
                except ApiException as exc:
                    if exc.status != 410:  # 410 Gone: our resourceVersion is too old; read afresh
                        raise self._error(exc, f"watching {name}", name) from None
                    status, version = read()
        except BaseException:
            reporter.close(None)
            raise
        reporter.close(status)
        return status

    # ------------------------------------------------------------------ logs

    def logs(self, name: str, rank: int = 0, follow: bool = False) -> str | Iterator[str]:
        """The trainer's log of the pod of ``rank`` (of the current attempt): the whole text, or, with
        follow=True, an iterator of lines that ends when the container does."""
        selector = pod_selector(self.status(name).get("children") or {}, rank)
        pods = self._call("listing pods", self.core.list_namespaced_pod, self.namespace,
                          label_selector=selector).items
        if not pods:
            raise LogsError(f"{name} has no pod of rank {rank} (selector {selector}): it may not have "
                            "started yet, be suspended, or have fewer replicas")
        pod = max(pods, key=lambda p: p.metadata.creation_timestamp)
        names = [c.name for c in pod.spec.containers]
        container = next((n for n in names if n in _api.TRAINER_CONTAINERS), names[0])
        waiting = [s.state.waiting for s in (pod.status.container_statuses or [])
                   if s.name == container and s.state and s.state.waiting]
        if waiting or (pod.status.phase == "Pending" and not pod.status.container_statuses):
            reason = waiting[0].reason if waiting else "Pending"
            raise LogsError(f"pod {pod.metadata.name} (rank {rank}) has not started its container yet "
                            f"({reason}): no logs yet; `wait` shows why it waits")
        if follow:
            return self._follow(pod.metadata.name, container)
        return str(self._call(f"reading the log of {pod.metadata.name}", self.core.read_namespaced_pod_log,
                              pod.metadata.name, self.namespace, container=container))

    def _follow(self, pod: str, container: str) -> Iterator[str]:
        from kubernetes import watch

        w = watch.Watch()
        try:
            yield from w.stream(self.core.read_namespaced_pod_log, pod, self.namespace, container=container)
        finally:
            w.stop()

    # ------------------------------------------------------------------ fetch


    # ------------------------------------------------------------------ upload


    def plot(self, name: str, out: str | os.PathLike[str]) -> Path:
        """Fetch progress.jsonl and write its loss and accuracy curves to ``out`` (PNG, matplotlib)."""
        from .plot import plot_progress, read_progress

        with tempfile.TemporaryDirectory() as tmp:
            got = self.fetch(name, tmp, files=["progress.jsonl"])
            if not got:
                raise FetchError(f"{name} has no progress.jsonl yet")
            records = read_progress(got[0].read_text(errors="replace"))
        return plot_progress(records, Path(out), title=name)
