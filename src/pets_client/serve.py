"""`tensorboard` as a mixin of PetsTrainingClient: start the TensorBoard pod (tensorboard.py), forward a
local port to it through the API server's portforward, delete the pod when done."""

from __future__ import annotations

import builtins
import contextlib
import selectors
import socket
import threading
import time
from typing import Any

from . import tensorboard as tb
from .errors import TensorBoardError, terminal_text
from .files import FETCH_POD_START_S, FilesMixin

POLL_S = 2.0
BUFFER = 1 << 16


def _pipe(a: Any, b: Any, stop: threading.Event) -> None:
    """Copy bytes both ways between two sockets until either closes (or ``stop``)."""
    with selectors.DefaultSelector() as sel:
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        while not stop.is_set():
            for key, _ in sel.select(timeout=0.5):
                try:
                    data = key.fileobj.recv(BUFFER)  # type: ignore[union-attr]
                    if not data:
                        return
                    key.data.sendall(data)
                except OSError:
                    return


class LocalForward:
    """A listener on 127.0.0.1:``port`` (0: any free one); each connection accepted is carried to a new
    remote socket from ``open_remote()`` (a socket and the thing to close after it)."""

    def __init__(self, port: int, open_remote: Any) -> None:
        try:
            self.server = socket.create_server(("127.0.0.1", port))
        except OSError as exc:
            raise TensorBoardError(f"cannot listen on localhost:{port} ({exc.strerror}): choose another "
                                   "port (kubectl pets tensorboard --port N; 0 for any free one)") from None
        self.server.settimeout(0.5)  # so close() ends the accept loop
        self.port: int = self.server.getsockname()[1]
        self.open_remote = open_remote
        self.error: str | None = None  # why the last connection could not be carried
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, name=f"forward :{self.port}", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._carry, args=(conn,), daemon=True).start()

    def _carry(self, conn: socket.socket) -> None:
        with conn:
            try:
                remote, closer = self.open_remote()
            except Exception as exc:  # noqa: BLE001 - the pod went or the API server refused: drop this one
                self.error = f"{type(exc).__name__}: {exc}"
                return
            try:
                _pipe(conn, remote, self.stop)
            finally:
                with contextlib.suppress(Exception):
                    closer.close()

    def close(self) -> None:
        self.stop.set()
        self.server.close()
        self.thread.join(timeout=2)


class TensorBoard(contextlib.AbstractContextManager["TensorBoard"]):
    """A running TensorBoard: ``url`` on this machine, ``pod`` in the namespace. A context manager;
    close() (or leaving the ``with``) stops the forward and deletes the pod."""

    def __init__(self, client: Any, pod: str, forward: LocalForward, served: builtins.list[str],
                 skipped: builtins.list[str]) -> None:
        self._client, self.pod, self._forward = client, pod, forward
        self.served, self.skipped = served, skipped
        self.port = forward.port
        self.url = tb.local_url(forward.port)

    @property
    def forward_error(self) -> str | None:
        """Why the last connection to ``url`` could not reach the pod (None while all went through)."""
        return self._forward.error

    def wait(self) -> None:
        """Block while the pod runs; TensorBoardError when it ends (its deadline, or it was deleted)."""
        while not (why := self._client._tensorboard_gone(self.pod)):
            time.sleep(POLL_S)
        raise TensorBoardError(why)

    def close(self) -> None:
        self._forward.close()
        self._client._delete_pod(self.pod)

    def __exit__(self, *exc: object) -> None:
        self.close()


class ServeMixin(FilesMixin):
    """tensorboard, on fetch's helper pods (FilesMixin); the client gives the API handles."""

    api_client: Any
    # kubernetes.stream swaps an ApiClient's call_api while it opens a stream, so the forward's opens (a
    # browser's several connections at once) go one at a time, on an ApiClient no other call uses
    _forward_lock = threading.Lock()
    _forward_core: Any = None

    def list(self) -> builtins.list[dict[str, Any]]:
        raise NotImplementedError

    def tensorboard(self, name: str | None = None, *, port: int = tb.PORT, image: str | None = None,
                    timeout: float = FETCH_POD_START_S, lifetime_s: int = tb.LIFETIME_S) -> TensorBoard:
        """Serve TensorBoard over the training's output claim and return it running: ``url`` is a local
        port (``port``, 0 for any free one) forwarded to the pod. ``name=None`` serves every training of
        the namespace that keeps its outputs on a claim, each a run of its own (``skipped`` says why the
        others are not).

        The pod runs ``image`` (default the client's trainer image, which holds TensorBoard) with the
        trainer's uid and hardening, mounts the claims read-only, and is deleted by close() (or leaving
        a ``with``); a client that dies without it leaves it to its ``lifetime_s`` deadline. Works once
        the training has finished, while its claim is kept. TensorBoardError for an emptyDir output
        (naming spec.output), a taken port, or a pod that does not start within ``timeout`` s."""
        from . import _api

        several = name is None
        trainings = self.list() if name is None else [self.get(name)]
        mounts, skipped = tb.served(trainings, all_=several)
        pod_name = ""  # the forward's connections find it here once the pod is made
        forward = LocalForward(port, lambda: self._open_forward(pod_name))
        try:
            manifest = tb.pod(mounts, image=image or _api.DEFAULT_IMAGE, several=several,
                              scheduling=tb.scheduling_of(trainings, several=several), lifetime_s=lifetime_s)
            pod_name = self._call("creating the TensorBoard pod", self.core.create_namespaced_pod,
                                  self.namespace, manifest).metadata.name
            try:
                self._wait_pod_running(pod_name, timeout, role=tb.COMPONENT, error=TensorBoardError)
            except TensorBoardError:
                if why := self._tensorboard_gone(pod_name):  # ended at once: say why, with its log
                    raise TensorBoardError(why) from None
                raise
            self._wait_ready(pod_name, timeout)
        except BaseException:
            forward.close()
            if pod_name:
                self._delete_pod(pod_name)
            raise
        return TensorBoard(self, pod_name, forward, [m.name for m in mounts], skipped)

    def _open_forward(self, pod: str) -> tuple[Any, Any]:
        """A socket to the pod's TensorBoard port, through a websocket of its own."""
        from kubernetes import client
        from kubernetes.stream import portforward

        with self._forward_lock:
            if self._forward_core is None:
                self._forward_core = client.CoreV1Api(client.ApiClient(self.api_client.configuration))
            pf = portforward(self._forward_core.connect_get_namespaced_pod_portforward, pod, self.namespace,
                             ports=str(tb.PORT))
        return pf.socket(tb.PORT), pf

    def _wait_ready(self, pod: str, timeout: float) -> None:
        """Until TensorBoard listens (the readiness probe); its log's end when the container ends."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if why := self._tensorboard_gone(pod):
                raise TensorBoardError(why)
            got = self._call("reading the TensorBoard pod", self.core.read_namespaced_pod, pod,
                             self.namespace)
            if any(c.type == "Ready" and c.status == "True" for c in got.status.conditions or []):
                return
            time.sleep(1)
        raise TensorBoardError(f"TensorBoard in {pod} did not answer within {timeout:g} s; see "
                               f"`kubectl -n {self.namespace} logs {pod}`")

    def _tensorboard_gone(self, pod: str) -> str | None:
        """Why the TensorBoard pod no longer serves (with its log's last lines), or None while it runs."""
        from kubernetes.client.exceptions import ApiException

        try:
            got = self.core.read_namespaced_pod(pod, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return f"the TensorBoard pod {pod} was deleted"
            raise
        if got.metadata.deletion_timestamp:
            return f"the TensorBoard pod {pod} is being deleted"
        if got.status.phase not in ("Failed", "Succeeded"):
            return None
        try:
            log = self.core.read_namespaced_pod_log(pod, self.namespace, container=tb.COMPONENT,
                                                    tail_lines=10)
        except ApiException:
            log = ""
        reason = got.status.reason or got.status.phase
        return terminal_text(f"the TensorBoard pod {pod} ended ({reason})" + (f":\n{log}" if log else ""))
