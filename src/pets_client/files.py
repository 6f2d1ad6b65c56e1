"""The client's file transfers, as a mixin of PetsTrainingClient: `fetch` a training's outputs from its
claim, `upload` a local folder to a claim. Both run a short-lived helper pod with the trainer's image and
hardening, and move the bytes over exec (`transfer`, `batches`, `upload`)."""

from __future__ import annotations

import builtins
import contextlib
import os
import time
import warnings
from pathlib import Path
from typing import IO, Any

from . import _api, batches
from . import upload as up
from .errors import (
    FetchError,
    InvalidTrainingError,
    PetsClientError,
    TrainingNotFoundError,
    UploadError,
    server_error,
    terminal_text,
)
from .transfer import (
    CHUNK_OUTPUT_BYTES,
    STDERR_KEPT_BYTES,
    WsExec,
    check_names,
    chunk_command,
    collect,
    decode_chunk,
    fetch_pod,
    list_request,
    no_claim_reason,
)

FETCH_POD_START_S = 120.0
EXEC_TIMEOUT_S = 600.0  # one command in a helper pod: a listing that hashes the files, or a chunk


def auto_tqdm() -> Any:
    """tqdm.auto's bar: a widget in notebooks, text elsewhere."""
    with warnings.catch_warnings():
        # Without ipywidgets, tqdm.auto falls back to the text bar with a warning; the text bar is fine.
        warnings.simplefilter("ignore")
        from tqdm.auto import tqdm
    return tqdm


class FilesMixin:
    """fetch and upload, and the client's calls to the API server (its errors mapped to the client's);
    the client gives the API handles and the namespace."""

    namespace: str
    core: Any  # kubernetes.client.CoreV1Api
    batch: Any  # kubernetes.client.BatchV1Api

    def get(self, name: str) -> dict[str, Any]:
        raise NotImplementedError

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

    def _trainer_image(self, training: dict[str, Any]) -> str:
        """The image the training's pods run: the Job's own, else spec.image, else the default."""
        spec = training.get("spec") or {}
        job = ((training.get("status") or {}).get("children") or {}).get("job")
        if job:
            from kubernetes.client.exceptions import ApiException

            with contextlib.suppress(ApiException):
                found: Any = self.batch.read_namespaced_job(job, self.namespace)
                return str(found.spec.template.spec.containers[0].image)
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
        reason = no_claim_reason(
            training, lost="there is nothing left to fetch",
            kept="summary.json, progress.jsonl, metrics.png, model.safetensors, config.yaml and "
                 "dataset.json; the final summary is in status.summary meanwhile.")
        if reason:
            raise FetchError(reason)
        wanted = builtins.list(files or _api.OUTPUT_FILES)
        check_names(wanted)
        manifest = fetch_pod(training, self._trainer_image(training), wanted)
        pod = self._call("creating the fetch pod", self.core.create_namespaced_pod, self.namespace, manifest)
        pod_name = pod.metadata.name
        try:
            self._wait_pod_running(pod_name, timeout)
            command, names, limit = list_request(_api.OUTPUT_DIR, wanted)
            listing = self._exec_bytes(pod_name, command, limit, stdin=names)
            got = collect(dest, wanted, listing,
                          lambda f, index: decode_chunk(self._exec_bytes(pod_name, chunk_command(f, index),
                                                                         CHUNK_OUTPUT_BYTES)))
            if not got:
                raise FetchError(f"none of {', '.join(wanted)} are in {name}'s output volume yet "
                                 "(the training has not written them)")
            return got
        finally:
            self._delete_pod(pod_name)

    def _delete_pod(self, pod: str) -> None:
        from kubernetes.client.exceptions import ApiException

        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(pod, self.namespace, grace_period_seconds=0)

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

    def _open_exec(self, pod: str, command: builtins.list[str], role: str, *, stdin: bool) -> Any:
        """A websocket exec stream of ``command`` in the ``role`` helper pod (its container has that name)."""
        from kubernetes.stream import stream

        return self._call(f"exec in the {role} pod", stream, self.core.connect_get_namespaced_pod_exec, pod,
                          self.namespace, command=command, container=role, stdin=stdin, stdout=True,
                          stderr=True, tty=False, binary=True, _preload_content=False)

    def _exec_bytes(self, pod: str, command: builtins.list[str], limit: int, *, role: str = "fetch",
                    error: type[PetsClientError] = FetchError, doing: str = "reading the outputs",
                    stdin: bytes = b"") -> bytes:
        """The stdout of ``command`` in the ``role`` helper pod (its container has that name), ``stdin``
        written to it; ``error`` (FetchError) when it goes past ``limit`` bytes (the pod's image is the
        training's: what it prints is not trusted), fails, or runs past EXEC_TIMEOUT_S."""
        pod_exec = WsExec(self._open_exec(pod, command, role, stdin=True), error, limit, role)
        if stdin:
            pod_exec.write(stdin)
        code, stderr = pod_exec.finish(EXEC_TIMEOUT_S)
        if code is None:
            raise error(f"{doing} did not end within {EXEC_TIMEOUT_S:g} s")
        if code:
            raise error(f"{doing} failed (exit {code}): {terminal_text(stderr.strip())}")
        return pod_exec.output()

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
        total = sum(f.size for f in files)
        created = self._ensure_claim(claim, total, access_modes, storage_class)
        pod = self._call("creating the upload pod", self.core.create_namespaced_pod, self.namespace,
                         up.upload_pod(claim, image, total, scheduling, files=len(files)))
        pod_name = pod.metadata.name
        root = f"{up.UPLOAD_DIR}/{sub}" if sub else up.UPLOAD_DIR

        def run(command: builtins.list[str], limit: int, doing: str) -> bytes:
            return self._exec_bytes(pod_name, command, limit, role="upload", error=UploadError, doing=doing)

        def open_exec(command: builtins.list[str], stdout_limit: int = 0) -> WsExec:
            return WsExec(self._open_exec(pod_name, command, "upload", stdin=True), UploadError, stdout_limit)

        try:
            self._wait_pod_running(pod_name, timeout, role="upload", error=UploadError)
            run(batches.prepare_command(root), STDERR_KEPT_BYTES, f"making {root} in the claim {claim}")
            copy_, skip = up.plan(files, batches.list_claim(open_exec, root, files))
            # bytes, with the files done as its postfix
            bar = auto_tqdm()(total=sum(f.size for f in copy_), unit="B", unit_scale=True, unit_divisor=1024,
                              desc=f"upload to {claim}", file=file, dynamic_ncols=True, disable=not progress,
                              leave=True)
            bar.set_postfix_str(f"0/{len(copy_)} files")
            try:
                batches.send(open_exec, root, copy_, bar.update,
                             lambda done: bar.set_postfix_str(f"{done}/{len(copy_)} files"))
            finally:
                bar.close()
            return up.UploadResult(claim=claim, path=up.dataset_path(sub), copied=len(copy_),
                                   skipped=len(skip), bytes_copied=sum(f.size for f in copy_),
                                   created_claim=created)
        finally:
            self._delete_pod(pod_name)
