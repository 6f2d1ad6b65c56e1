"""`upload`'s transport: files in batches, each one tar stream on one exec's stdin into the helper pod.

A batch is a tar of a manifest (``sha256sum -c`` lines) and the files, unpacked by the pod into a
staging folder under the upload directory, checked file by file against the manifest, and only then
renamed into place: a name holds the whole new file or what it held before, and a batch that does not
arrive whole moves nothing and is sent again. That check is what once made chunks of base64 arguments
necessary: the kubernetes client's exec stream dropped frames of large *outputs*, and a frame lost on
the way in fails it the same way. Each batch's check in the pod overlaps the next batch's stream.
What is already in the claim is listed by one exec, its names on stdin (``list_claim``).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import tarfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from .errors import UploadError
from .transfer import check_names, list_request, parse_list
from .upload import LocalFile

BATCH_BYTES = 64 << 20  # data per exec: a batch that fails is sent again whole
BATCH_FILES = 4000  # files per exec: the pod's moves are one mv per folder of a batch
BATCH_TRIES = 3
SEND_BYTES = 256 << 10  # one write on the exec stream, one websocket frame (1 MiB: 90 MB/s, 256 KiB: 122)
STAGING_PREFIX = ".pets-upload."  # a batch's staging folder under the upload directory
MANIFEST = "manifest.sha256"
FILES = "files"


class PodExec(Protocol):
    """One exec in the upload pod with its stdin open (transfer.WsExec over the API; a process in tests)."""

    def write(self, data: bytes) -> None: ...

    def finish(self, timeout: float) -> tuple[int | None, str]:
        """Closes stdin and waits: (exit code, or None when it did not end in ``timeout``; stderr)."""
        ...

    def output(self) -> bytes:
        """What it printed on stdout (up to the limit it was opened with)."""
        ...


OpenExec = Callable[..., PodExec]  # (command, stdout_limit=0) -> PodExec


def prepare_command(root: str) -> list[str]:
    """Makes the upload directory, removes the staging folders an interrupted upload left there, and
    fails (exit 3) when it cannot be written."""
    script = ('mkdir -p "$0" 2>/dev/null; [ -d "$0" ] && [ -w "$0" ] || '
              '{ echo "$0 cannot be written by uid $(id -u)" >&2; exit 3; }; '
              'rm -rf "$0"/' + STAGING_PREFIX + '*')
    return ["sh", "-c", script, root]


def batches(files: list[LocalFile], max_bytes: int = BATCH_BYTES,
            max_files: int = BATCH_FILES) -> list[list[LocalFile]]:
    """``files`` in order, in batches of at most ``max_files`` files and ``max_bytes`` of data (a file
    larger than that is a batch of its own)."""
    out: list[list[LocalFile]] = []
    batch: list[LocalFile] = []
    used = 0
    for f in files:
        if batch and (len(batch) == max_files or used + f.size > max_bytes):
            out.append(batch)
            batch, used = [], 0
        batch.append(f)
        used += f.size
    if batch:
        out.append(batch)
    return out


def _header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")


def _padding(size: int) -> bytes:
    return b"\0" * (-size % tarfile.BLOCKSIZE)


def manifest(batch: list[LocalFile]) -> bytes:
    """The batch's `sha256sum -c` list: the pod checks every file against it before it takes its name."""
    return "".join(f"{f.sha256}  {f.name}\n" for f in batch).encode()


def batch_size(batch: list[LocalFile]) -> int:
    """The bytes of batch_stream: the pod reads exactly these (head -c), so a stream cut short ends."""
    members = [(MANIFEST, len(manifest(batch)))] + [(f"{FILES}/{f.name}", f.size) for f in batch]
    return sum(len(_header(n, s)) + s + len(_padding(s)) for n, s in members) + 2 * tarfile.BLOCKSIZE


class LocalChange(UploadError):
    """A file is not what the walk read: sending it again would not help."""


def batch_stream(batch: list[LocalFile], advance: Callable[[int], None] = lambda n: None) -> Iterator[bytes]:
    """The batch as one tar stream: the manifest, then each file under ``files/`` (read as it goes, its
    sha256 checked against the walk's: LocalChange when the file changed since)."""
    data = manifest(batch)
    yield _header(MANIFEST, len(data)) + data + _padding(len(data))
    for f in batch:
        yield _header(f"{FILES}/{f.name}", f.size)
        digest, left = hashlib.sha256(), f.size
        with f.path.open("rb") as src:
            while left and (block := src.read(min(left, SEND_BYTES))):
                digest.update(block)
                left -= len(block)
                advance(len(block))
                yield block
        if left or digest.hexdigest() != f.sha256:
            raise LocalChange(f"{f.path} changed while it was uploaded; upload again")
        yield _padding(f.size)
    yield b"\0" * (2 * tarfile.BLOCKSIZE)


def frames(pieces: Iterable[bytes], size: int = SEND_BYTES) -> Iterator[bytes]:
    """``pieces`` joined into writes of about ``size`` bytes: a tar of tiny files is mostly 512-byte
    headers, and each write is a websocket frame."""
    buf = bytearray()
    for piece in pieces:
        buf += piece
        if len(buf) >= size:
            yield bytes(buf)
            buf.clear()
    if buf:
        yield bytes(buf)


def receive_command(root: str, token: str, size: int) -> list[str]:
    """The pod's half of a batch: exactly ``size`` bytes of stdin unpacked into a staging folder under
    ``root``, every file checked against the manifest (sha256sum -c), and only then moved into place
    (rename: a name holds the whole new file or what it held before). Exit 4 when the batch did not
    arrive whole (nothing moved), 5 when a file cannot take its name."""
    if not re.fullmatch(r"[0-9a-f]{8,32}", token):
        raise UploadError(f"{token!r} is not a batch token")
    move = ('r=$0; for d; do mkdir -p "$r/$d" && { find "$d" -maxdepth 1 -type f -print0 | '
            'xargs -0 -r mv -f -t "$r/$d" --; } || exit 5; done')
    script = (
        'cd "$0" || exit 3; s=' + STAGING_PREFIX + '$1; rm -rf "$s"; mkdir "$s" || exit 5; '
        'if ! head -c "$2" | tar -x -m -f - -C "$s"; then rm -rf "$s"; '
        'echo "the batch did not arrive whole" >&2; exit 4; fi; '
        'cd "$s/' + FILES + '" && sha256sum -c --quiet --strict ../' + MANIFEST + ' >&2 || '
        '{ cd "$0"; rm -rf "$s"; echo "the batch does not match its sha256 list: nothing moved" >&2; '
        'exit 4; }; '
        "find . -type d -exec sh -c '" + move + "' \"$0\" {} + || exit 5; "
        'cd "$0" && rm -rf "$s"')
    return ["sh", "-c", script, root, token, str(size)]


def finish_timeout(batch: list[LocalFile]) -> float:
    """How long the pod may take after the last byte of a batch: its check and moves."""
    return 60 + sum(f.size for f in batch) / 5e6 + len(batch) * 0.02


def list_claim(open_exec: OpenExec, root: str, files: list[LocalFile]) -> list[tuple[str, int, str]]:
    """(name, size, sha256) of each of ``files`` already under ``root`` in the claim: one exec, the names
    on its stdin. A frame lost from its output loses lines, never makes one up whole: a file not listed
    is copied again, which costs time, not data."""
    check_names(wanted := [f.name for f in files])
    command, names, limit = list_request(root, wanted)
    pod = open_exec(command, stdout_limit=limit)
    stream(pod, frames([names]))
    timeout = 120 + sum(f.size for f in files) / 20e6  # it reads every file there: 20 MB/s at least
    code, stderr = pod.finish(timeout)
    if code is None:
        raise UploadError(f"listing the claim took more than {timeout:.0f} s")
    if code:
        raise UploadError(f"listing the claim failed (exit {code}): {stderr.strip()}")
    return parse_list(pod.output())


def stream(pod: PodExec, data: Iterable[bytes]) -> int:
    """``data`` written to the pod's stdin; UploadError with its stderr when the pod ended first."""
    sent = 0
    try:
        for frame in data:
            pod.write(frame)
            sent += len(frame)
    except LocalChange:
        pod.finish(0)
        raise
    except UploadError as err:  # the pod ended early: its stderr says why
        code, stderr = pod.finish(5)
        raise UploadError(f"{err} (exit {code}): {stderr.strip()}") from None
    return sent


def start_batch(open_exec: OpenExec, root: str, batch: list[LocalFile],
                advance: Callable[[int], None] = lambda n: None) -> PodExec:
    """A batch streamed to a new exec, which is left to check and move it (end_batch)."""
    size = batch_size(batch)
    pod = open_exec(receive_command(root, secrets.token_hex(8), size))
    if (sent := stream(pod, frames(batch_stream(batch, advance)))) != size:
        raise AssertionError(f"a batch of {sent} bytes, {size} announced")
    return pod


def end_batch(pod: PodExec, batch: list[LocalFile]) -> None:
    """The pod's check and moves of a batch awaited; UploadError when they failed."""
    code, stderr = pod.finish(finish_timeout(batch))
    if code is None:
        raise UploadError(f"the upload pod did not finish a batch of {len(batch)} files in "
                          f"{finish_timeout(batch):.0f} s")
    if code:
        raise UploadError(f"a batch of {len(batch)} files ({batch[0].name} ...) failed (exit {code}): "
                          f"{stderr.strip()}")


def send_batch(open_exec: OpenExec, root: str, batch: list[LocalFile],
               advance: Callable[[int], None] = lambda n: None) -> None:
    """One batch through one exec, start to end; UploadError (LocalChange when a local file changed)."""
    end_batch(start_batch(open_exec, root, batch, advance), batch)


def send(open_exec: OpenExec, root: str, files: list[LocalFile],
         advance: Callable[[int], None] = lambda n: None, done: Callable[[int], None] = lambda n: None,
         tries: int = BATCH_TRIES, max_files: int = BATCH_FILES) -> None:
    """Every file, batch by batch, each batch's end awaited (by one thread) while the next streams; a
    batch that failed is sent again at the end, ``tries`` times in all (its files that already took
    their names are sent again too: that writes the same bytes). A local change fails at once."""
    count = 0
    failed: list[tuple[list[LocalFile], UploadError]] = []

    def settle(pending: tuple[Future[None], list[LocalFile]] | None) -> None:
        nonlocal count
        if pending is None:
            return
        try:
            pending[0].result()
        except UploadError as err:
            failed.append((pending[1], err))
            return
        count += len(pending[1])
        done(count)

    with ThreadPoolExecutor(max_workers=1) as waiter:
        pending: tuple[Future[None], list[LocalFile]] | None = None
        for batch in batches(files, max_files=max_files):
            pod = None
            try:
                pod = start_batch(open_exec, root, batch, advance)
            except LocalChange:
                raise
            except UploadError as err:
                failed.append((batch, err))
            settle(pending)
            pending = (waiter.submit(end_batch, pod, batch), batch) if pod else None
        settle(pending)
    for batch, first in failed:
        last: UploadError = first
        for _ in range(tries - 1):
            try:
                send_batch(open_exec, root, batch, advance)
                break
            except LocalChange:
                raise
            except UploadError as again:
                last = again
        else:
            raise last
        count += len(batch)
        done(count)


