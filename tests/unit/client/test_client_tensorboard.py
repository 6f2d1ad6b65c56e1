"""`kubectl pets tensorboard`: the pod, its command and logdir spec, the claims it serves or refuses, the
local forward, and the CLI's clean-up."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from pets_client import TensorBoardError
from pets_client import cli as pets_cli
from pets_client import tensorboard as tb
from pets_client.serve import LocalForward
from pets_client.transfer import fetch_pod

pytestmark = pytest.mark.unit


def training(name: str, output: dict[str, Any] | None, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": ({"output": output} if output is not None else {}) | spec}


def test_one_training_is_served_from_its_claim_read_only_with_the_fetch_pods_hardening() -> None:
    t = training("pets", {"persistentVolumeClaim": {"claimName": "outs", "path": "/runs/a/"}},
                 imagePullSecrets=[{"name": "regcred"}], nodeSelector={"pool": "gpu"})
    mounts, skipped = tb.served([t], all_=False)
    pod = tb.pod(mounts, image="img:1", several=False, scheduling=tb.scheduling_of([t], several=False))
    spec, (c,) = pod["spec"], pod["spec"]["containers"]
    assert skipped == []
    assert c["command"] == ["tensorboard", "--logdir", "/output/tensorboard", "--bind_all", "--port", "6006"]
    assert c["name"] == "tensorboard" and c["image"] == "img:1" and c["ports"][0]["containerPort"] == 6006
    assert c["volumeMounts"] == [
        {"name": "claim-0", "mountPath": "/output", "readOnly": True, "subPath": "runs/a"},
        {"name": "tmp", "mountPath": "/tmp"}]
    assert spec["volumes"] == [{"name": "claim-0", "persistentVolumeClaim": {"claimName": "outs",
                                                                              "readOnly": True}},
                               {"name": "tmp", "emptyDir": {}}]
    fetch = fetch_pod(t, "img:1", ["summary.json"])
    assert spec["securityContext"] == fetch["spec"]["securityContext"]
    assert c["securityContext"] == fetch["spec"]["containers"][0]["securityContext"]
    assert spec["automountServiceAccountToken"] is False and spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == tb.LIFETIME_S
    assert spec["imagePullSecrets"] == [{"name": "regcred"}] and spec["nodeSelector"] == {"pool": "gpu"}
    assert pod["metadata"]["generateName"] == "pets-tensorboard-"
    assert pod["metadata"]["labels"][tb.SERVED_LABEL] == "pets"


def test_all_serves_each_claimed_training_as_a_run_and_says_why_the_others_are_not() -> None:
    ts = [training("b", {"persistentVolumeClaim": {"claimName": "shared", "path": "/b"}},
                   imagePullSecrets=[{"name": "one"}], nodeSelector={"pool": "x"}),
          training("a", {"managedClaim": {}}, imagePullSecrets=[{"name": "one"}, {"name": "two"}]),
          training("c", {"persistentVolumeClaim": {"claimName": "shared", "path": "/c"}}),
          training("scratch", {"emptyDir": {}}),
          training("new", None)]
    mounts, skipped = tb.served(ts, all_=True)
    assert [(m.name, m.claim, m.sub_path, m.mount_path) for m in mounts] == [
        ("a", "a-output", "", "/outputs/a"), ("b", "shared", "b", "/outputs/b"),
        ("c", "shared", "c", "/outputs/c")]
    assert len(skipped) == 2 and "spec.output" in skipped[1] and "emptyDir" in skipped[1]
    assert "not yet chosen" in skipped[0]
    assert tb.logdir_spec(mounts) == ("a:/outputs/a/tensorboard,b:/outputs/b/tensorboard,"
                                      "c:/outputs/c/tensorboard")
    pod = tb.pod(mounts, image="img", several=True, scheduling=tb.scheduling_of(ts, several=True))
    spec, (c,) = pod["spec"], pod["spec"]["containers"]
    assert c["command"][:3] == ["tensorboard", "--logdir_spec", tb.logdir_spec(mounts)]
    # a claim two trainings share is one volume, mounted twice
    assert [v["name"] for v in spec["volumes"]] == ["claim-0", "claim-1", "tmp"]
    assert [(m["name"], m.get("subPath")) for m in c["volumeMounts"]] == [
        ("claim-0", None), ("claim-1", "b"), ("claim-1", "c"), ("tmp", None)]
    assert all(m["readOnly"] for m in c["volumeMounts"][:3])
    assert spec["imagePullSecrets"] == [{"name": "one"}, {"name": "two"}] and "nodeSelector" not in spec
    assert pod["metadata"]["generateName"] == "pets-tensorboard-" and tb.SERVED_LABEL not in \
        pod["metadata"]["labels"]


def test_an_emptydir_output_is_refused_naming_spec_output() -> None:
    with pytest.raises(TensorBoardError, match=r"emptyDir \(spec.output\)") as err:
        tb.served([training("scratch", {"emptyDir": {}})], all_=False)
    assert "spec.output.managedClaim" in str(err.value)
    fell_back = training("pets", None) | {"status": {"output": {"emptyDir": {}},
                                                     "outputReason": "NoDefaultStorageClass"}}
    with pytest.raises(TensorBoardError, match="chosen by the operator: NoDefaultStorageClass"):
        tb.served([fell_back], all_=False)
    with pytest.raises(TensorBoardError, match="no training of the namespace keeps its outputs on a claim"):
        tb.served([training("scratch", {"emptyDir": {}})], all_=True)
    with pytest.raises(TensorBoardError, match="no training"):
        tb.served([], all_=True)


def test_a_run_name_tensorboard_would_split_is_refused() -> None:
    with pytest.raises(TensorBoardError, match="cannot name a TensorBoard run"):
        tb.logdir_spec([tb.Served("a:b", "c", "", "/outputs/a:b")])


def _echo_server() -> tuple[socket.socket, int]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(1024):
                    conn.sendall(data.upper())

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def test_the_local_forward_carries_each_connection_to_a_remote_of_its_own() -> None:
    server, port = _echo_server()
    opened: list[socket.socket] = []

    def open_remote() -> tuple[socket.socket, socket.socket]:
        remote = socket.create_connection(("127.0.0.1", port))
        opened.append(remote)
        return remote, remote

    forward = LocalForward(0, open_remote)
    try:
        for word in (b"tensor", b"board"):
            with socket.create_connection(("127.0.0.1", forward.port), timeout=10) as conn:
                conn.sendall(word)
                assert conn.recv(1024) == word.upper()
        assert len(opened) == 2
        with pytest.raises(TensorBoardError, match=f"cannot listen on localhost:{forward.port}"):
            LocalForward(forward.port, open_remote)
    finally:
        forward.close()
        server.close()


def test_the_pods_command_serves_every_trainings_tags_through_the_forward(tmp_path: Path) -> None:
    """The real TensorBoard of this environment, with the pod's own flags: the flags exist, and the
    runs of --all are the trainings' names."""
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    for name in ("a", "b"):
        writer = EventFileWriter(str(tmp_path / name / "tensorboard"))
        writer.add_event(Event(wall_time=time.time(), step=1, summary=Summary(
            value=[Summary.Value(tag="train/loss", simple_value=0.5)])))
        writer.close()
    mounts = [tb.Served(n, "claim", "", str(tmp_path / n)) for n in ("a", "b")]
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    argv = tb.command(mounts, several=True)
    assert argv[-2:] == ["--port", str(tb.PORT)]
    proc = subprocess.Popen([str(Path(sys.executable).parent / "tensorboard"), *argv[1:-1], str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def open_remote() -> tuple[socket.socket, socket.socket]:
        remote = socket.create_connection(("127.0.0.1", port))
        return remote, remote

    forward = LocalForward(0, open_remote)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "TensorBoard did not start"
                time.sleep(0.2)
        tags = tb.local_url(forward.port) + "data/plugin/scalars/tags"
        body = urllib.request.urlopen(tags, timeout=30).read()
        assert b'"a/."' in body and b'"b/."' in body and b"train/loss" in body
    finally:
        forward.close()
        proc.terminate()
        proc.wait(timeout=30)


class FakeBoard:
    def __init__(self, stop_with: BaseException) -> None:
        self.url, self.pod, self.served, self.skipped = "http://localhost:6006/", "pets-tensorboard-x", \
            ["a", "b"], ["scratch writes its outputs to an emptyDir (spec.output)\x1b[31m"]
        self.stop_with, self.closed = stop_with, False

    def __enter__(self) -> FakeBoard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed = True

    def wait(self) -> None:
        raise self.stop_with


class FakeClient:
    def __init__(self, board: FakeBoard) -> None:
        self.board, self.calls = board, []  # type: ignore[var-annotated]

    def tensorboard(self, name: str | None, **kwargs: Any) -> FakeBoard:
        self.calls.append((name, kwargs))
        return self.board


@pytest.mark.parametrize(("stop", "code"), [(KeyboardInterrupt(), 130), (TensorBoardError("pod ended"), 1)])
def test_the_cli_prints_the_url_and_deletes_the_pod_on_ctrl_c_or_an_error(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stop: BaseException,
        code: int) -> None:
    fake = FakeClient(FakeBoard(stop))
    monkeypatch.setattr(pets_cli, "_client", lambda args: fake)
    assert pets_cli.main(["tensorboard", "--all", "--port", "0"]) == code
    out, err = capsys.readouterr()
    assert "TensorBoard of a, b: http://localhost:6006/ (pod pets-tensorboard-x" in out
    assert "left out: scratch" in err and "\x1b" not in err
    assert fake.board.closed
    assert fake.calls == [(None, {"port": 0, "image": None, "timeout": 120.0})]


@pytest.mark.parametrize("argv", [["tensorboard"], ["tensorboard", "pets", "--all"]])
def test_the_cli_takes_a_name_or_all(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        pets_cli.main(argv)
    assert exit_.value.code == 2 and "NAME or --all" in capsys.readouterr().err
