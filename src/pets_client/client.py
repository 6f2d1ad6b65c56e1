"""PetsTrainingClient: create, watch, inspect and collect PetsTrainings from Python.

Only the kubernetes client, PyYAML and tqdm: no torch, so a notebook without the trainer's stack can
drive trainings on a cluster. Everything goes through the API server with the caller's own
credentials (a kubeconfig, or a pod's service account).
"""

from __future__ import annotations

import builtins
import copy
import io
import os
import secrets
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from . import _api, batches
from . import upload as up
from .errors import (
    FetchError,
    InvalidTrainingError,
    LogsError,
    PetsClientError,
    TrainingDeletedError,
    TrainingNotFoundError,
    UploadError,
    WaitTimeoutError,
    server_error,
    terminal_text,
)
from .progress import BarState, bar_state, dataset_line, final_line, phase_line
from .transfer import (
    CHUNK_OUTPUT_BYTES,
    STDERR_KEPT_BYTES,
    WsExec,
    check_names,
    chunk_command,
    collect,
    decode_chunk,
    fetch_pod,
    list_command,
    listing_limit,
    output_claim,
)

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
WATCH_CHUNK_S = 300  # one watch request at most this long; then it resumes from the last resourceVersion
FETCH_POD_START_S = 120.0


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
        kind = given.get("kind", _api.KIND)
        if kind != _api.KIND:
            raise InvalidTrainingError(f"kind: expected {_api.KIND}, got {kind!r}", fields=["kind"])
        version = given.get("apiVersion", _api.API_VERSION)
        if version != _api.API_VERSION:
            raise InvalidTrainingError(f"apiVersion: expected {_api.API_VERSION}, got {version!r}",
                                       fields=["apiVersion"])
        body = given
        body.setdefault("spec", {})
        if body["spec"] is None:
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
        with warnings.catch_warnings():
            # Without ipywidgets, tqdm.auto falls back to the text bar with a warning; the text bar is fine.
            warnings.simplefilter("ignore")
            from tqdm.auto import tqdm
        # `initial`: the steps done before the bar appeared (a late watch, a resumed run) are not counted
        # in its rate, which then comes from the steps seen while it runs.
        return tqdm(total=state.total, initial=state.n, unit=state.unit, desc=self._desc(state),
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


def _upload_bar(claim: str, total: int, files: int, enabled: bool, file: IO[str] | None) -> Any:
    """upload's bar: bytes, with the files done as its postfix (tqdm.auto, as _Reporter)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from tqdm.auto import tqdm
    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"upload to {claim}",
               file=file, dynamic_ncols=True, disable=not enabled, leave=True)
    bar.set_postfix_str(f"0/{files} files")
    return bar


# ----------------------------------------------------------------------------- the client


class PetsTrainingClient:
    """PetsTrainings in one namespace.

    namespace: default the kubeconfig context's namespace (in a pod: its own), else "default".
    kubeconfig: a kubeconfig file; default $KUBECONFIG, ~/.kube/config, or the pod's service account.
    context: a kubeconfig context other than the current one.
    api_client: a ready kubernetes.client.ApiClient (then kubeconfig and context are not read).
    """

    def __init__(self, namespace: str | None = None, kubeconfig: str | os.PathLike[str] | None = None, *,
                 context: str | None = None, api_client: Any = None) -> None:
        from kubernetes import client

        if api_client is None:
            api_client, context_ns = _load_api_client(kubeconfig, context)
        else:
            context_ns = None
        self.api_client = api_client
        self.namespace: str = namespace or context_ns or "default"
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)

    def __repr__(self) -> str:
        return f"PetsTrainingClient(namespace={self.namespace!r})"

    # ------------------------------------------------------------------ errors

    def _error(self, exc: Any, what: str, name: str | None = None) -> PetsClientError:
        message, fields, causes = server_error(exc)
        status = getattr(exc, "status", None)
        if status == 404 and name is not None and "the server could not find" not in message.lower():
            return TrainingNotFoundError(f"no PetsTraining {name!r} in namespace {self.namespace!r}")
        if status == 404:
            return PetsClientError(
                f"{what}: {message} (is the PetsTraining CRD installed? helm install the chart "
                "charts/pets-training; does the namespace exist?)")
        if status in (400, 422):
            return InvalidTrainingError(message, fields=fields, status=status, causes=causes)
        if status == 403:
            return PetsClientError(f"{what}: not allowed: {message}")
        return PetsClientError(f"{what}: HTTP {status}: {message}")

    def _call(self, what: str, fn: Any, *args: Any, name: str | None = None, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            raise self._error(exc, what, name) from None

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
        claim = up.check_claim_name(claim or up.dataset_claim_name(metadata["name"]))
        up.with_dataset(body, claim, sub)
        body["metadata"].pop("namespace", None)
        self._call("checking the PetsTraining (dry run)", self.custom.create_namespaced_custom_object,
                   _api.GROUP, _api.VERSION, self.namespace, _api.PLURAL, body, dry_run="All")
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
        created = self._call("creating the PetsTraining", self.custom.create_namespaced_custom_object,
                             _api.GROUP, _api.VERSION, self.namespace, _api.PLURAL, body)
        return str(created["metadata"]["name"])

    def get(self, name: str) -> dict[str, Any]:
        """The PetsTraining object (a dict)."""
        return self._call(f"reading {name}", self.custom.get_namespaced_custom_object,  # type: ignore[no-any-return]
                          _api.GROUP, _api.VERSION, self.namespace, _api.PLURAL, name, name=name)

    def status(self, name: str) -> dict[str, Any]:
        """Its status (empty until the operator has written one)."""
        return self.get(name).get("status") or {}

    def list(self) -> builtins.list[dict[str, Any]]:
        """Every PetsTraining of the namespace, oldest first."""
        items = self._call("listing PetsTrainings", self.custom.list_namespaced_custom_object,
                           _api.GROUP, _api.VERSION, self.namespace, _api.PLURAL)["items"]
        return sorted(items, key=lambda o: (o["metadata"].get("creationTimestamp") or "",
                                            o["metadata"]["name"]))

    def delete(self, name: str) -> None:
        """Delete it; its Job, Service and pods go with it (owner references)."""
        self._call(f"deleting {name}", self.custom.delete_namespaced_custom_object,
                   _api.GROUP, _api.VERSION, self.namespace, _api.PLURAL, name,
                   body={"propagationPolicy": "Background"}, name=name)

    def _set_suspend(self, name: str, value: bool) -> dict[str, Any]:
        return self._call(f"patching {name}", self.custom.patch_namespaced_custom_object,  # type: ignore[no-any-return]
                          _api.GROUP, _api.VERSION, self.namespace, _api.PLURAL, name,
                          {"spec": {"suspend": value}}, name=name)

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
        try:
            obj = self.get(name)
            status = obj.get("status") or {}
            reporter.update(status)
            version = obj["metadata"]["resourceVersion"]
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
                        if status.get("phase") in _api.FINISHED_PHASES:
                            w.stop()
                            break
                        if deadline is not None and time.monotonic() >= deadline:
                            w.stop()
                            break
                except ApiException as exc:
                    if exc.status != 410:  # 410 Gone: our resourceVersion is too old; read afresh
                        raise self._error(exc, f"watching {name}", name) from None
                    obj = self.get(name)
                    status = obj.get("status") or {}
                    reporter.update(status)
                    version = obj["metadata"]["resourceVersion"]
        except BaseException:
            reporter.close(None)
            raise
        reporter.close(status)
        return status

    # ------------------------------------------------------------------ logs

    def _pod_of_rank(self, name: str, rank: int) -> Any:
        children = self.status(name).get("children") or {}
        selector = pod_selector(children, rank)
        pods = self._call("listing pods", self.core.list_namespaced_pod, self.namespace,
                          label_selector=selector).items
        if not pods:
            raise LogsError(f"{name} has no pod of rank {rank} (selector {selector}): it may not have "
                            "started yet, be suspended, or have fewer replicas")
        return max(pods, key=lambda p: p.metadata.creation_timestamp)

    @staticmethod
    def _container(pod: Any) -> str:
        names = [c.name for c in pod.spec.containers]
        return next((n for n in names if n in _api.TRAINER_CONTAINERS), names[0])

    def logs(self, name: str, rank: int = 0, follow: bool = False) -> str | Iterator[str]:
        """The trainer's log of the pod of ``rank`` (of the current attempt): the whole text, or, with
        follow=True, an iterator of lines that ends when the container does."""
        pod = self._pod_of_rank(name, rank)
        container = self._container(pod)
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

    def _trainer_image(self, training: dict[str, Any]) -> str:
        """The image the training's pods run: the Job's own, else spec.image, else the default."""
        spec = training.get("spec") or {}
        job = ((training.get("status") or {}).get("children") or {}).get("job")
        if job:
            from kubernetes.client.exceptions import ApiException

            try:
                found: Any = self.batch.read_namespaced_job(job, self.namespace)
                return str(found.spec.template.spec.containers[0].image)
            except ApiException:
                pass
        return str(spec.get("image") or _api.DEFAULT_IMAGE)

    def fetch(self, name: str, dest: str | os.PathLike[str], *, files: builtins.list[str] | None = None,
              timeout: float = FETCH_POD_START_S) -> builtins.list[Path]:
        """Copy the training's outputs (summary.json, progress.jsonl, metrics.png, model.safetensors,
        config.yaml, dataset.json, or ``files``) into ``dest`` and return the paths copied.

        Works when the training writes to a claim (the default: spec.output unset or managedClaim; or
        spec.output.persistentVolumeClaim): a
        short-lived pod with the training's image mounts the claim read-only, the files come back through
        the exec API in checked chunks (sizes and sha256 first: the client's exec stream can drop frames of
        a large output), and the pod is deleted. With an emptyDir output the files went with the pods:
        FetchError.
        ``timeout`` bounds the wait for that pod to start. The pod runs the training's image, so what it
        sends is checked before anything is written (collect): only the names asked for, each once,
        each resolved inside ``dest``, no more bytes than listed; FetchError names a refused entry.
        """
        training = self.get(name)
        chosen = training.get("status") or {}
        if not (training.get("spec") or {}).get("output") and not chosen.get("output"):
            raise FetchError(f"{name}: the operator has not yet chosen where it writes (status.output is "
                             "unset); try again once it has seen the training")
        if output_claim(training) is None:
            where = "spec.output" if (training.get("spec") or {}).get("output") else \
                f"status.output, chosen by the operator: {chosen.get('outputReason')}"
            raise FetchError(
                f"{name} writes its outputs to an emptyDir ({where}), which lived and went with its "
                "pods: there is nothing left to fetch. Train with spec.output.managedClaim ({} is enough: "
                "the operator makes the claim) or spec.output.persistentVolumeClaim (claimName: a claim in "
                "this namespace) to keep summary.json, progress.jsonl, metrics.png, model.safetensors, "
                "config.yaml and dataset.json; the final summary is in status.summary meanwhile.")
        wanted = builtins.list(files or _api.OUTPUT_FILES)
        check_names(wanted)
        manifest = fetch_pod(training, self._trainer_image(training), wanted)
        pod = self._call("creating the fetch pod", self.core.create_namespaced_pod, self.namespace, manifest)
        pod_name = pod.metadata.name
        try:
            self._wait_pod_running(pod_name, timeout)
            listing = self._exec_bytes(pod_name, list_command(wanted), listing_limit(wanted))
            got = collect(dest, wanted, listing,
                          lambda f, index: decode_chunk(self._exec_bytes(pod_name, chunk_command(f, index),
                                                                         CHUNK_OUTPUT_BYTES)))
            if not got:
                raise FetchError(f"none of {', '.join(wanted)} are in {name}'s output volume yet "
                                 "(the training has not written them)")
            return got
        finally:
            from kubernetes.client.exceptions import ApiException

            try:
                self.core.delete_namespaced_pod(pod_name, self.namespace, grace_period_seconds=0)
            except ApiException:
                pass

    def _wait_pod_running(self, pod: str, timeout: float, *, role: str = "fetch",
                          error: type[PetsClientError] = FetchError) -> None:
        from kubernetes import watch

        deadline = time.monotonic() + timeout
        last = "Pending"
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise error(f"the {role} pod {pod} did not start within {timeout:g} s "
                                 f"({terminal_text(last)}); "
                                 f"see `kubectl -n {self.namespace} describe pod {pod}`")
            w = watch.Watch()
            for event in w.stream(self.core.list_namespaced_pod, self.namespace,
                                  field_selector=f"metadata.name={pod}", timeout_seconds=max(1, int(left)),
                                  _request_timeout=int(left) + 30):
                got = event["object"]
                phase = got.status.phase if got.status else None
                for s in (got.status.container_statuses or []) if got.status else []:
                    if s.state and s.state.waiting and s.state.waiting.reason:
                        last = s.state.waiting.reason + (f": {s.state.waiting.message}"
                                                         if s.state.waiting.message else "")
                        if s.state.waiting.reason in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                                                      "ErrImageNeverPull", "CreateContainerConfigError"):
                            w.stop()
                            raise error(f"the {role} pod {pod} cannot start: {terminal_text(last)}")
                for c in (got.status.conditions or []) if got.status else []:
                    if c.type == "PodScheduled" and c.status == "False" and c.message:
                        last = f"{c.reason}: {c.message}"
                if phase == "Running":
                    w.stop()
                    return
                if phase in ("Failed", "Succeeded"):
                    w.stop()
                    raise error(f"the {role} pod {pod} ended ({phase}) before it could copy anything")

    def _exec_bytes(self, pod: str, command: builtins.list[str], limit: int, *, role: str = "fetch",
                    error: type[PetsClientError] = FetchError, doing: str = "reading the outputs") -> bytes:
        """The stdout of ``command`` in the ``role`` helper pod (its container has that name); ``error``
        (FetchError) when it goes past ``limit`` bytes (the pod's image is the training's: what it prints
        is not trusted) or the command fails."""
        from kubernetes.stream import stream

        resp = self._call(f"exec in the {role} pod", stream, self.core.connect_get_namespaced_pod_exec, pod,
                          self.namespace, command=command, container=role, stdin=False, stdout=True,
                          stderr=True, tty=False, binary=True, _preload_content=False)
        out, err = io.BytesIO(), io.BytesIO()
        try:
            def keep(stdout: bytes | None, stderr: bytes | None) -> None:
                out.write(stdout or b"")
                if err.tell() < STDERR_KEPT_BYTES:
                    err.write((stderr or b"")[:STDERR_KEPT_BYTES - err.tell()])
                if out.tell() > limit:
                    raise error(f"the {role} pod sent more than the {limit} bytes its command can "
                                     "print: refused (it runs the training's image: is that the trainer?)")

            while resp.is_open():
                resp.update(timeout=5)
                keep(resp.read_stdout() if resp.peek_stdout() else None,
                     resp.read_stderr() if resp.peek_stderr() else None)
            # what arrived with the last frames, after the stream closed
            keep(resp.read_stdout(timeout=0), resp.read_stderr(timeout=0))
            code = resp.returncode
        finally:
            resp.close()
        if code:
            raise error(f"{doing} failed (exit {code}): "
                             f"{terminal_text(err.getvalue().decode(errors='replace').strip())}")
        return out.getvalue()

    # ------------------------------------------------------------------ upload

    def upload(self, local_dir: str | os.PathLike[str], *, claim: str, path: str = "/",
               image: str | None = None, access_modes: builtins.list[str] | None = None,
               storage_class: str | None = None, progress: bool = True, file: IO[str] | None = None,
               timeout: float = FETCH_POD_START_S) -> up.UploadResult:
        """Copy every regular file under ``local_dir`` into the claim ``claim`` at ``path`` (relative
        names kept) and return what was copied and skipped.

        The claim is made when it does not exist: 1.5 times the data rounded up to whole GiB, at least
        1Gi (upload.claim_size), on the default StorageClass (or ``storage_class``), ReadWriteMany by
        default (``access_modes``): a data claim is read by every pod of a training, on any node. An
        existing claim whose capacity is smaller than the data is refused. A helper pod mounts it
        read-write (``image``: default the operator's default trainer image, pets-training/trainer; no
        training gives one here) and is deleted at the end. Files already there with the same sha256 are
        skipped, so a second run resumes; each file copied is checked by its sha256 in the pod before it
        takes its name. ``timeout`` bounds the wait for that pod to start. Arguments are checked (the
        folder, its names, the claim name, the path) before anything is created: UploadError.
        """

        check = up.check_claim_name(claim)
        sub = up.claim_dir(path)
        files = up.walk(local_dir)
        return self._upload(files, check, sub, image=image or _api.DEFAULT_IMAGE,
                            access_modes=access_modes or ["ReadWriteMany"], storage_class=storage_class,
                            progress=progress, file=file, timeout=timeout, scheduling=None)

    def _ensure_claim(self, claim: str, total: int, access_modes: builtins.list[str],
                      storage_class: str | None) -> bool:
        """True when the claim was made here; UploadError when an existing one is too small."""
        from kubernetes.client.exceptions import ApiException


        try:
            found = self.core.read_namespaced_persistent_volume_claim(claim, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise self._error(exc, f"reading the claim {claim}") from None
            self._call(f"creating the claim {claim}", self.core.create_namespaced_persistent_volume_claim,
                       self.namespace, up.claim_manifest(claim, total, access_modes, storage_class))
            return True
        capacity = (found.status.capacity or {}).get("storage") if found.status else None
        resources = found.spec.resources if found.spec else None
        requested = (resources.requests or {}).get("storage") if resources else None
        up.check_capacity(claim, capacity or requested, total)
        return False

    def _upload(self, files: builtins.list[up.LocalFile], claim: str, sub: str, *, image: str,
                access_modes: builtins.list[str], storage_class: str | None, progress: bool,
                file: IO[str] | None, timeout: float, scheduling: dict[str, Any] | None) -> up.UploadResult:
        from kubernetes.client.exceptions import ApiException


        total = sum(f.size for f in files)
        created = self._ensure_claim(claim, total, access_modes, storage_class)
        pod = self._call("creating the upload pod", self.core.create_namespaced_pod, self.namespace,
                         up.upload_pod(claim, image, total, scheduling, files=len(files)))
        pod_name = pod.metadata.name
        root = up.remote_root(sub)

        def run(command: builtins.list[str], limit: int, doing: str) -> bytes:
            return self._exec_bytes(pod_name, command, limit, role="upload", error=UploadError, doing=doing)

        def open_exec(command: builtins.list[str], stdout_limit: int = 0) -> WsExec:
            from kubernetes.stream import stream

            resp = self._call("exec in the upload pod", stream, self.core.connect_get_namespaced_pod_exec,
                              pod_name, self.namespace, command=command, container="upload", stdin=True,
                              stdout=True, stderr=True, tty=False, binary=True, _preload_content=False)
            return WsExec(resp, UploadError, stdout_limit)

        try:
            self._wait_pod_running(pod_name, timeout, role="upload", error=UploadError)
            run(batches.prepare_command(root), STDERR_KEPT_BYTES, f"making {root} in the claim {claim}")
            copy_, skip = up.plan(files, batches.list_claim(open_exec, root, files))
            bar = _upload_bar(claim, sum(f.size for f in copy_), len(copy_), progress, file)
            try:
                batches.send(open_exec, root, copy_, bar.update,
                             lambda done: bar.set_postfix_str(f"{done}/{len(copy_)} files"))
            finally:
                bar.close()
            return up.UploadResult(claim=claim, path=up.dataset_path(sub), copied=len(copy_),
                                   skipped=len(skip), bytes_copied=sum(f.size for f in copy_),
                                   created_claim=created)
        finally:
            try:
                self.core.delete_namespaced_pod(pod_name, self.namespace, grace_period_seconds=0)
            except ApiException:
                pass

    def plot(self, name: str, out: str | os.PathLike[str]) -> Path:
        """Fetch progress.jsonl and write its loss and accuracy curves to ``out`` (PNG, matplotlib)."""
        from .plot import plot_progress, read_progress

        with tempfile.TemporaryDirectory() as tmp:
            got = self.fetch(name, tmp, files=["progress.jsonl"])
            if not got:
                raise FetchError(f"{name} has no progress.jsonl yet")
            records = read_progress(got[0].read_text(errors="replace"))
        return plot_progress(records, Path(out), title=name)
