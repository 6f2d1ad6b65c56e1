"""The helper-pod transfer protocol of fetch and upload: a short-lived pod that mounts a claim, and files
carried through the exec API in checked chunks.

The kubernetes client's exec stream can drop whole frames of a large output, so every transfer states
sizes and sha256 first, moves files in chunks small enough to come through (a short chunk is read
again), and checks each whole file against its digest. What a pod sends is checked before anything is
written: only the names asked for, each once, each resolved inside the destination.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import copy
import hashlib
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

from pets_contract.names import RUN_AS

from . import _api
from .errors import FetchError

FETCH_UID = RUN_AS  # the images' user: the trainer's files on a claim are its own


def output_claim(training: dict[str, Any]) -> dict[str, Any] | None:
    """The claim a training writes its outputs to ({claimName, path?}), or None for an emptyDir (or a
    training the operator has not yet seen): spec.output.persistentVolumeClaim, or the claim the operator
    makes for spec.output.managedClaim; where spec.output is unset, what the operator chose
    (status.output: a managed claim by default)."""
    output = (training.get("spec") or {}).get("output") or (training.get("status") or {}).get("output") or {}
    if output.get("managedClaim") is not None:
        return {"claimName": f"{training['metadata']['name']}{_api.OUTPUT_CLAIM_SUFFIX}"}
    return output.get("persistentVolumeClaim") or None


def no_claim_reason(training: dict[str, Any], *, lost: str, kept: str) -> str | None:
    """Why ``training`` has no output claim to read (naming spec.output, or the operator's status.output),
    or None when it has one. ``lost``: what an emptyDir output took with its pods; ``kept``: what a claim
    would keep."""
    name = training["metadata"]["name"]
    spec_output = (training.get("spec") or {}).get("output")
    chosen = training.get("status") or {}
    if not spec_output and not chosen.get("output"):
        return (f"{name}: the operator has not yet chosen where it writes (status.output is unset); try "
                "again once it has seen the training")
    if output_claim(training) is not None:
        return None
    where = "spec.output" if spec_output else \
        f"status.output, chosen by the operator: {chosen.get('outputReason')}"
    return (f"{name} writes its outputs to an emptyDir ({where}), which lived and went with its pods: "
            f"{lost}. "
            "Train with spec.output.managedClaim ({} is enough: the operator makes the claim) or "
            f"spec.output.persistentVolumeClaim (claimName: a claim in this namespace) to keep {kept}")


def helper_pod(*, owner: str, component: str, image: str, claim_name: str | None, volume_name: str,
               mount_path: str, read_only: bool, sub_path: str = "", scheduling: dict[str, Any] | None = None,
               labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
               lifetime_s: int = 900) -> dict[str, Any]:
    """A short-lived pod that mounts one claim at ``mount_path`` and sleeps, for the client's exec calls
    (`fetch` reads through it, `upload` writes). Its container is named ``component``. ``scheduling``: a
    training spec whose nodeSelector, tolerations, imagePullSecrets and priorityClassName it copies."""
    ro = {"readOnly": True} if read_only else {}
    sub = sub_path.strip("/")
    mount = {"name": volume_name, "mountPath": mount_path} | ro | ({"subPath": sub} if sub else {})
    security: dict[str, Any] = {"runAsNonRoot": True, "runAsUser": FETCH_UID, "runAsGroup": FETCH_UID,
                                "seccompProfile": {"type": "RuntimeDefault"}}
    if not read_only:
        # As the trainer's pods (builders.py): a claim's root made by a provisioner is writable by the
        # group; OnRootMismatch skips the recursive chown of a claim that already has its data.
        security |= {"fsGroup": FETCH_UID, "fsGroupChangePolicy": "OnRootMismatch"}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": lifetime_s,  # goes away by itself if the client dies before deleting it
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        # The trainer's uid and gid (the operator's builders.RUN_AS, the images' user): the trainer writes
        # model.safetensors 0600, so only its own uid can read it back, and reads what upload wrote.
        "securityContext": security,
        "containers": [{
            "name": component,
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["sleep", str(lifetime_s)],
            "volumeMounts": [mount],
            # upload's pod unpacks and hashes what it receives (coreutils' sha256sum: 380 MB/s a core):
            # under a 500m limit that check took as long as the copy
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                          "limits": {"cpu": "2", "memory": "256Mi"}},
            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]}},
        }],
        "volumes": [{"name": volume_name, "persistentVolumeClaim": {"claimName": claim_name} | ro}],
    }
    for key in ("nodeSelector", "tolerations", "imagePullSecrets", "priorityClassName"):
        if (scheduling or {}).get(key):
            pod_spec[key] = copy.deepcopy((scheduling or {})[key])
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": f"{owner[:40]}-{component}-",
            "labels": {_api.LABEL_NAME: _api.APP_NAME, _api.LABEL_COMPONENT: component,
                       _api.LABEL_MANAGED_BY: _api.CLIENT_MANAGED_BY} | (labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": pod_spec,
    }


def fetch_pod(training: dict[str, Any], image: str, files: list[str]) -> dict[str, Any]:
    """A short-lived pod that mounts the training's output claim read-only, for `fetch`."""
    name = training["metadata"]["name"]
    claim = output_claim(training) or {}
    return helper_pod(owner=name, component="fetch", image=image, claim_name=claim.get("claimName"),
                      volume_name="output", mount_path=_api.OUTPUT_DIR, read_only=True,
                      sub_path=str(claim.get("path") or "/"), scheduling=training.get("spec") or {},
                      labels={f"{_api.GROUP}/fetch-of": name},
                      annotations={f"{_api.GROUP}/files": ",".join(files)})


_SAFE_FILE = re.compile(r"^[A-Za-z0-9_.-][A-Za-z0-9_./-]*$")


# The exec stream of the kubernetes client (37.0.2, v5.channel.k8s.io, against this project's cluster)
# dropped whole 32 KiB websocket frames from large outputs: a 45 MB tar came back about 1.2 MB short,
# binary or base64 alike, with exit code 0. So fetch checks everything it reads: sizes and sha256
# first, then each file in chunks small enough to come through (a short chunk is read again), and the
# whole file against its digest.
CHUNK_BYTES = 1 << 20
CHUNK_TRIES = 3
# The fetch pod runs the training's image, which may print anything: nothing it sends is trusted.
# A file is assembled in memory, so a listed size above this is refused (a resnet50d
# model.safetensors is about 95 MB); nothing read is longer than the listing says.
MAX_FETCH_FILE_BYTES = 8 << 30
CHUNK_OUTPUT_BYTES = 4 * ((CHUNK_BYTES + 2) // 3) + 64  # one chunk's base64, and a little whitespace
STDERR_KEPT_BYTES = 4096


def check_name(name: str) -> str:
    """``name`` when it is a plain relative path under the output directory (letters, digits, ``_.-/``;
    no empty, ``.`` or ``..`` part, not absolute); else FetchError naming it."""
    if (not isinstance(name, str) or not _SAFE_FILE.fullmatch(name)
            or any(p in ("", ".", "..") for p in name.split("/"))):
        raise FetchError(f"cannot fetch {name!r}: a path relative to the output directory is needed "
                         "(letters, digits, '_', '.', '-' and '/', no '.' or '..' part)")
    return name


def check_names(files: list[str]) -> None:
    for f in files:
        check_name(f)


def list_request(root: str, names: list[str]) -> tuple[list[str], bytes, int]:
    """The listing of fetch and upload: which of ``names`` (the caller checks them) are files under ``root``,
    as `S <size> <name>` and `<sha256>  <name>` lines. Returns the pod's command, its stdin (the names, one
    a line: they never reach a command line of the pod's shell) and the most bytes it prints for them
    (what a pod sends beyond that is refused). A stat and a sha256sum per few thousand names: a process
    per file made a second upload of 1,797 files take 28 s."""
    stdin = "".join(f"{name}\n" for name in names).encode()
    there = 'for f; do [ -f "$f" ] && printf "%s\\0" "$f"; done'
    script = ('cd "$0" || exit 3; head -c "$1" | tr "\\n" "\\0" | '
              f"xargs -0 -r sh -c '{there}' sh | "
              """xargs -0 -r sh -c 'stat -c "S %s %n" -- "$@" && sha256sum -- "$@"' sh || exit 3""")
    limit = sum(2 * len(n.encode()) + 2 + 21 + 1 + 64 + 2 + 1 for n in names) + 64
    return ["sh", "-c", script, root, str(len(stdin))], stdin, limit


_LIST_SIZE = re.compile(r"^S ([0-9]{1,20}) (.+)$")
_LIST_DIGEST = re.compile(r"^([0-9a-f]{64})  (.+)$")


def parse_list(text: bytes) -> list[tuple[str, int, str]]:
    """list_request's output -> (name, size, sha256) for each size line whose name has a digest line
    (lines of another shape are left out; fetch's check_listing then holds the names, each once, and the
    sizes to what was asked for)."""
    sizes: list[tuple[str, int]] = []
    digests: dict[str, str] = {}
    for line in text.decode(errors="replace").split("\n"):
        if m := _LIST_SIZE.match(line):
            sizes.append((m.group(2), int(m.group(1))))
        elif m := _LIST_DIGEST.match(line):
            digests[m.group(2)] = m.group(1)
    return [(name, size, digests[name]) for name, size in sizes if name in digests]


def chunk_command(name: str, index: int) -> list[str]:
    """Chunk ``index`` (CHUNK_BYTES each) of the file ``name`` under /output, as base64."""
    check_names([name])
    script = 'cd "$0" && dd if="$1" bs=' + str(CHUNK_BYTES) + ' skip="$2" count=1 2>/dev/null | base64 -w0'
    return ["sh", "-c", script, _api.OUTPUT_DIR, name, str(index)]


def check_listing(wanted: list[str], listing: list[tuple[str, int, str]],
                  max_bytes: int = MAX_FETCH_FILE_BYTES) -> list[tuple[str, int, str]]:
    """The listing when it names only files of ``wanted``, each once, each a plain relative name, each
    no larger than ``max_bytes``; else FetchError naming the first entry that is not."""
    asked = set(wanted)
    seen: set[str] = set()
    for name, size, _ in listing:
        if name not in asked:
            raise FetchError(f"the fetch pod listed {name!r}, which was not asked for "
                             f"(asked: {', '.join(sorted(asked))}): nothing was written")
        if name in seen:
            raise FetchError(f"the fetch pod listed {name!r} twice: nothing was written")
        seen.add(name)
        check_name(name)
        if size < 0 or size > max_bytes:
            raise FetchError(f"the fetch pod listed {name!r} at {size} bytes, more than the "
                             f"{max_bytes} a fetch takes: nothing was written")
    return listing


def target_path(dest: str | os.PathLike[str], name: str) -> Path:
    """Where ``name`` is written under ``dest``, or FetchError naming it: the name is checked again
    (whatever its size), and the path with every symlink already in ``dest`` resolved (the parents
    and the file itself) must lie inside the resolved ``dest``. The path returned is the resolved
    parent joined with the file's own name (an existing file or link there is replaced, not followed)."""
    check_name(name)

    def resolved(path: Path) -> Path:
        try:
            return Path(os.path.realpath(path, strict=True))
        except FileNotFoundError:  # not there yet, or a link to nothing: resolved as far as it goes
            return Path(os.path.realpath(path))
        except OSError as exc:  # a link loop
            raise FetchError(f"cannot write {name!r}: {exc}") from None

    root = Path(os.path.realpath(dest))
    parent = resolved(root.joinpath(*name.split("/")[:-1]))
    final = resolved(parent / name.split("/")[-1])
    for path in (parent, final):
        if path != root and not path.is_relative_to(root):
            raise FetchError(f"cannot write {name!r}: {path} is outside {root} (a symlink in the "
                             "destination points out of it): nothing was written")
    if final == root:
        raise FetchError(f"cannot write {name!r}: it is the destination itself")
    return parent / name.split("/")[-1]


def assemble(name: str, size: int, digest: str, read_chunk: Any) -> bytes:
    """The file from its chunks (``read_chunk(index)`` -> bytes), each checked for length and read
    again when short (a longer one is refused: it is not what the listing said), the whole checked
    against ``digest``; FetchError when it cannot be had whole."""
    data = bytearray()
    for index in range((size + CHUNK_BYTES - 1) // CHUNK_BYTES):
        want = min(CHUNK_BYTES, size - index * CHUNK_BYTES)
        for _ in range(CHUNK_TRIES):
            chunk = read_chunk(index)
            if len(chunk) > want:
                raise FetchError(f"{name}: chunk {index} came back with {len(chunk)} bytes, more than the "
                                 f"{want} the listing says (the file changed, or the pod is not telling "
                                 "the truth); fetch again")
            if len(chunk) == want:
                break
        else:
            raise FetchError(f"{name}: chunk {index} came back with {len(chunk)} of {want} bytes "
                             f"{CHUNK_TRIES} times; fetch again")
        data += chunk
    if hashlib.sha256(data).hexdigest() != digest:
        raise FetchError(f"{name}: the copy does not match its sha256 in the volume; fetch again")
    return bytes(data)


def decode_chunk(encoded: bytes) -> bytes:
    """A chunk as chunk_command printed it; b"" when it is not whole base64 (read it again)."""
    try:
        return base64.b64decode(encoded.strip(), validate=True)
    except binascii.Error:
        return b""


def _make_dirs(root: Path, name: str) -> None:
    """The directories of ``name`` under ``root``, each made as a real directory (never through a link)."""
    here = root
    for part in name.split("/")[:-1]:
        here = here / part
        with contextlib.suppress(FileExistsError):
            here.mkdir()
        if here.is_symlink() or not here.is_dir():
            target_path(root, name)  # a link that stays inside is fine; one that leads out is refused
            if not here.is_dir():
                raise FetchError(f"cannot write {name!r}: {here} is not a directory")


def save(dest: Path, name: str, data: bytes) -> Path:
    """Write a fetched file under ``dest``: the name checked and resolved again (target_path), into a
    new file in the resolved directory (O_EXCL, O_NOFOLLOW) that then replaces the file's name, so
    neither a link nor a hard link already there is written through. FetchError names what it refused."""
    root = Path(os.path.realpath(dest))
    target_path(root, name)
    try:
        root.mkdir(parents=True, exist_ok=True)
        _make_dirs(root, name)
        path = target_path(root, name)
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.part"
        flags = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0))
        fd = os.open(tmp, flags, 0o666)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise FetchError(f"cannot write {name!r} under {dest}: {exc}") from exc
    return Path(dest).joinpath(*name.split("/"))


def collect(dest: str | os.PathLike[str], wanted: list[str], listing_text: bytes,
            read_chunk: Any) -> list[Path]:
    """fetch's local half: the pod's listing checked (check_listing) and every target path checked
    (target_path) before anything is read or written, then each file assembled from
    ``read_chunk(name, index)`` and saved. An empty list when none of ``wanted`` is there."""
    check_names(wanted)
    listing = check_listing(wanted, parse_list(listing_text))
    for fname, _, _ in listing:
        target_path(dest, fname)
    return [save(Path(dest), fname,
                 assemble(fname, size, digest, lambda index, f=fname: read_chunk(f, index)))
            for fname, size, digest in listing]


def _mask(key: bytes, data: bytes) -> bytes:
    """``data`` XOR the 4-byte websocket ``key`` repeated: one big-int XOR, about twice as fast as
    websocket-client's (which copies both into arrays first; its masking was half the client's CPU)."""
    n = len(data)
    keys = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(keys, "little")).to_bytes(n, "little")


def _stdin_frame(data: bytes) -> Any:
    """A binary websocket frame of ``data`` on channel 0 (stdin), masked by _mask (a client masks all it
    sends, RFC 6455 5.3)."""
    from websocket import ABNF

    payload = b"\0" + data
    frame: Any = ABNF(fin=1, opcode=ABNF.OPCODE_BINARY, data=payload)
    frame._get_masked = lambda key: key + _mask(key, payload)  # the key: os.urandom's 4 bytes
    return frame


class WsExec:
    """batches.PodExec over the kubernetes client's exec stream (a WSClient opened with stdin): writes go
    out as frames; stdout is kept up to ``stdout_limit`` bytes (more is refused: the pod runs the
    training's image), stderr's first STDERR_KEPT_BYTES for the error."""

    def __init__(self, resp: Any, error: type[Exception], stdout_limit: int = 0,
                 role: str = "upload") -> None:
        self.resp, self.error, self.stdout_limit, self.role = resp, error, stdout_limit, role
        self.stdout = bytearray()
        self.stderr = bytearray()

    def _drain(self) -> None:
        if self.resp.peek_stdout():
            self.stdout += self.resp.read_stdout()
            if len(self.stdout) > self.stdout_limit:
                raise self.error(f"the {self.role} pod sent more than the {self.stdout_limit} bytes its "
                                 "command can print: refused (it runs the training's image: is that the "
                                 "trainer?)")
        if self.resp.peek_stderr():  # read even when enough is kept: left unread, it piles up in resp
            self.stderr += self.resp.read_stderr()[:max(0, STDERR_KEPT_BYTES - len(self.stderr))]

    def output(self) -> bytes:
        return bytes(self.stdout)

    def write(self, data: bytes) -> None:
        from websocket import WebSocketException

        try:
            if not self.resp.is_open():
                raise self.error(f"the {self.role} pod closed the stream")
            self.resp.sock.send_frame(_stdin_frame(data))
            self.resp.update(timeout=0)
            self._drain()
        except (OSError, WebSocketException) as exc:
            raise self.error(f"the {self.role} stream broke ({type(exc).__name__}: {exc})") from None

    def finish(self, timeout: float) -> tuple[int | None, str]:
        deadline = time.monotonic() + timeout
        try:
            while self.resp.is_open() and time.monotonic() < deadline:
                self.resp.update(timeout=min(5.0, max(0.0, deadline - time.monotonic())))
                self._drain()
            self.resp.update(timeout=0)
            self._drain()
            code = None if self.resp.is_open() else self.resp.returncode
        except self.error:
            raise
        except Exception:  # noqa: BLE001 - a stream that broke has no exit code to give
            code = None
        finally:
            self.resp.close()
        return code, self.stderr.decode(errors="replace")
