"""upload's transport (issue 43): batches of one tar stream each on an exec's stdin, run here through the
same sh, head, tar, sha256sum, find, xargs and mv as the helper pod, over a process's stdin."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pets_client import FetchError, UploadError
from pets_client.batches import (
    SEND_BYTES,
    STAGING_PREFIX,
    LocalChange,
    batch_size,
    batch_stream,
    batches,
    frames,
    list_claim,
    prepare_command,
    receive_command,
    send,
    send_batch,
)
from pets_client.transfer import list_request, parse_list
from pets_client.upload import LocalFile, plan, walk

from .test_client_upload import _sha, _write

pytestmark = pytest.mark.unit


def _run(command: list[str]) -> subprocess.CompletedProcess[bytes]:
    assert command[:2] == ["sh", "-c"]
    return subprocess.run(command, capture_output=True, check=False)


class _LocalExec:
    """upload.PodExec as a process here, with the same sh, head, tar, sha256sum, find and mv as the pod;
    ``damage`` changes what goes through (a frame lost or altered on the way)."""

    def __init__(self, command: list[str], damage: Callable[[bytes], bytes] = lambda b: b,
                 stdout_limit: int = 0) -> None:
        assert command[:2] == ["sh", "-c"]
        self.stdout = tempfile.TemporaryFile()  # noqa: SIM115 - read at finish: a pipe could fill first
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=self.stdout,
                                     stderr=subprocess.PIPE)
        self.damage = damage
        self.limit = stdout_limit
        self.out = b""

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(self.damage(data))
        except BrokenPipeError:
            raise UploadError("the upload pod closed the stream") from None

    def finish(self, timeout: float) -> tuple[int | None, str]:
        _, err = self.proc.communicate(timeout=max(timeout, 30))
        self.stdout.seek(0)
        self.out = self.stdout.read()
        self.stdout.close()
        assert len(self.out) <= self.limit, "more than the command can print"
        return self.proc.returncode, err.decode()

    def output(self) -> bytes:
        return self.out


def _claim(tmp_path: Path) -> Path:
    root = tmp_path / "claim"
    assert _run(prepare_command(str(root))).returncode == 0
    return root


def _listed(root: Path, files: list[LocalFile]) -> list[tuple[str, int, str]]:
    return list_claim(_LocalExec, str(root), files)


def test_a_folder_goes_in_batches_byte_for_byte_and_a_second_run_copies_nothing(tmp_path: Path) -> None:
    tree = {f"class_{i % 3}/img_{i}.jpg": os.urandom(i * 37) for i in range(40)}
    tree |= {"empty.jpg": b"", "big.bin": os.urandom(SEND_BYTES * 2 + 123), "a/b/c/deep.png": b"deep",
             ".hidden": b"h", "n" * 120 + ".jpg": b"long name"}
    _write(tmp_path / "imgs", tree)
    files = walk(tmp_path / "imgs")
    root = _claim(tmp_path)
    (root / "class_1").mkdir()
    (root / "class_1/img_1.jpg").write_bytes(b"stale")  # replaced whole
    (root / (STAGING_PREFIX + "0123abcd")).mkdir()  # what an interrupted upload left: prepare removes it
    assert _run(prepare_command(str(root))).returncode == 0
    advanced: list[int] = []
    done: list[int] = []
    send(_LocalExec, str(root), files, advanced.append, done.append, max_files=7)
    for name, data in tree.items():
        assert (root / name).read_bytes() == data, name
    assert sum(advanced) == sum(len(d) for d in tree.values()) and done == [7, 14, 21, 28, 35, 42, 45]
    assert [p.name for p in root.iterdir() if p.name.startswith(STAGING_PREFIX)] == []
    copy_, skip = plan(files, _listed(root, files))
    assert copy_ == [] and len(skip) == len(files)
    (root / "big.bin").write_bytes(b"changed in the claim")
    assert [f.name for f in plan(files, _listed(root, files))[0]] == ["big.bin"]


@pytest.mark.parametrize("damage", [
    lambda b: b[:520] + bytes([b[520] ^ 1]) + b[521:],  # a digest in the manifest altered
    lambda b: b[:-1600] + b"\0" * 1600,  # the last file's last bytes zeroed
    lambda b: b[:len(b) // 2],  # half of a frame lost: the stream ends short
])
def test_a_batch_that_does_not_arrive_whole_moves_nothing(tmp_path: Path,
                                                          damage: Callable[[bytes], bytes]) -> None:
    _write(tmp_path / "imgs", {"a.jpg": os.urandom(5000), "sub/b.jpg": os.urandom(7000)})
    files = walk(tmp_path / "imgs")
    root = _claim(tmp_path)
    (root / "a.jpg").write_bytes(b"old")
    with pytest.raises(UploadError, match=r"failed \(exit 4\)"):
        send_batch(lambda c, **_: _LocalExec(c, damage), str(root), files)
    assert (root / "a.jpg").read_bytes() == b"old" and not (root / "sub").exists()
    assert sorted(p.name for p in root.iterdir()) == ["a.jpg"], "the staging folder is gone"


def test_a_batch_that_fails_is_sent_again_and_a_local_change_is_not(tmp_path: Path) -> None:
    _write(tmp_path / "imgs", {"a.jpg": os.urandom(3000)})
    files = walk(tmp_path / "imgs")
    root = _claim(tmp_path)
    opened: list[list[str]] = []

    def flaky(command: list[str], stdout_limit: int = 0) -> _LocalExec:
        opened.append(command)
        return _LocalExec(command, (lambda b: b[:100]) if len(opened) == 1 else (lambda b: b))

    send(flaky, str(root), files)
    assert len(opened) == 2 and (root / "a.jpg").read_bytes() == files[0].path.read_bytes()
    files[0].path.write_bytes(b"changed since the walk")
    opened.clear()
    with pytest.raises(LocalChange, match="changed while it was uploaded"):
        send(flaky, str(root), files)
    assert len(opened) == 1, "a local change is not sent again"
    lying = [LocalFile("b.jpg", 3, _sha(b"abc"), files[0].path)]  # a size the file does not have
    with pytest.raises(LocalChange):
        send(_LocalExec, str(root), lying)
    assert not (root / "b.jpg").exists()


def test_a_file_that_cannot_take_its_name_fails_the_batch_with_the_pods_words(tmp_path: Path) -> None:
    _write(tmp_path / "imgs", {"a.jpg": b"a", "b.jpg": b"b"})
    root = _claim(tmp_path)
    (root / "b.jpg").mkdir()  # a folder where the file goes
    with pytest.raises(UploadError, match=r"exit 5\).*b.jpg"):
        send(_LocalExec, str(root), walk(tmp_path / "imgs"), tries=1)


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=12),
       name_len=st.integers(1, 150), max_bytes=st.integers(1, 8000), max_files=st.integers(1, 5))
def test_batches_keep_order_and_limits_and_their_size_is_what_the_stream_sends(
        tmp_path: Path, sizes: list[int], name_len: int, max_bytes: int, max_files: int) -> None:
    files = []
    for i, size in enumerate(sizes):
        data = os.urandom(size)
        (tmp_path / f"{i}").write_bytes(data)
        files.append(LocalFile(f"d/{i}{'x' * name_len}", size, _sha(data), tmp_path / f"{i}"))
    got = batches(files, max_bytes, max_files)
    assert [f for b in got for f in b] == files
    assert all(len(b) <= max_files and (len(b) == 1 or sum(f.size for f in b) <= max_bytes) for b in got)
    for batch in got:
        assert batch_size(batch) == len(b"".join(batch_stream(batch)))


def test_frames_join_small_pieces_and_keep_every_byte() -> None:
    pieces = [b"h" * 512, b"x" * 10, b"y" * 3_000_000, b"z"]
    out = list(frames(pieces, SEND_BYTES))
    assert b"".join(out) == b"".join(pieces) and len(out) == 2


def test_the_listing_is_one_exec_bounded_and_checked(tmp_path: Path) -> None:
    names = {f"class_{i % 7}/image_{i}.jpg": str(i).encode() for i in range(3000)}
    _write(tmp_path / "claim", {n: d for n, d in names.items() if not n.endswith("7.jpg")})
    files = [LocalFile(n, len(d), _sha(d), Path("/nowhere")) for n, d in names.items()]
    opened: list[list[str]] = []

    def counted(command: list[str], stdout_limit: int = 0) -> _LocalExec:
        opened.append(command)
        return _LocalExec(command, stdout_limit=stdout_limit)

    listing = list_claim(counted, str(tmp_path / "claim"), files)
    assert len(opened) == 1 and sum(len(a) for a in opened[0]) < 1000, "the names go on stdin"
    there = [(f.name, f.size, f.sha256) for f in files if not f.name.endswith("7.jpg")]
    assert sorted(listing) == sorted(there)
    assert list_request("/data", [f.name for f in files])[2] < 200 * len(files)
    with pytest.raises(FetchError):
        list_claim(counted, str(tmp_path / "claim"), [LocalFile("../etc/passwd", 1, "0" * 64, Path("/x"))])
    text = (b"S 3 a.jpg\n" + _sha(b"abc").encode() + b"  a.jpg\nS 9 only-size.jpg\n"
            + b"junk line\n" + _sha(b"").encode() + b"  only-digest.jpg\n")
    assert parse_list(text) == [("a.jpg", 3, _sha(b"abc"))]
    with pytest.raises(UploadError, match="token"):
        receive_command("/data", "x; rm -rf /", 10)


