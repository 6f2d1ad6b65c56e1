"""upload's pure parts (issue 23): the local tree, the names, the plan, the claim size, the chunk commands
(run here with the same sh, base64, dd, sha256sum and mv as the helper pod), and the CLI's arguments."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pets_client import UploadError, cli
from pets_client.client import PetsTrainingClient
from pets_client.transfer import list_command, listing_limit, parse_listing
from pets_client.upload import (
    GIB,
    MAX_ARG_BYTES,
    UPLOAD_CHUNK_BYTES,
    UPLOAD_CHUNKS_PER_EXEC,
    LocalFile,
    UploadResult,
    argv_ok,
    check_capacity,
    check_claim_name,
    claim_dir,
    claim_manifest,
    claim_size,
    commit_command,
    exec_groups,
    listing_batches,
    plan,
    read_chunks,
    temp_name,
    upload_pod,
    walk,
    write_command,
)

pytestmark = pytest.mark.unit


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write(root: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


# ----------------------------------------------------------------------------- the local tree


def test_walk_lists_every_regular_file_with_its_size_and_digest(tmp_path: Path) -> None:
    files = {"cat_1.jpg": b"meow", "sub/dog_2.jpg": b"woof" * 1000, "sub/deeper/empty.jpg": b""}
    _write(tmp_path / "imgs", files)
    os.symlink("cat_1.jpg", tmp_path / "imgs" / "cat_link.jpg")  # a link inside: copied as the file
    os.symlink("sub", tmp_path / "imgs" / "sublink")  # a directory link: not followed
    os.mkfifo(tmp_path / "imgs" / "fifo")  # not a regular file: left out
    got = walk(tmp_path / "imgs")
    assert [(f.name, f.size, f.sha256) for f in got] == sorted(
        [(n, len(d), _sha(d)) for n, d in files.items()] + [("cat_link.jpg", 4, _sha(b"meow"))])
    assert all(f.path.is_file() for f in got)


def test_walk_refuses_a_symlink_that_leads_out_or_nowhere(tmp_path: Path) -> None:
    _write(tmp_path / "imgs", {"a.jpg": b"a"})
    (tmp_path / "secret").write_bytes(b"s")
    os.symlink(tmp_path / "secret", tmp_path / "imgs" / "b.jpg")
    with pytest.raises(UploadError, match=r"local_dir: 'b.jpg' .* symlink outside it"):
        walk(tmp_path / "imgs")
    os.unlink(tmp_path / "imgs" / "b.jpg")
    os.symlink(tmp_path, tmp_path / "imgs" / "up")  # a directory link out, even if not followed
    with pytest.raises(UploadError, match="'up' .* outside"):
        walk(tmp_path / "imgs")
    os.unlink(tmp_path / "imgs" / "up")
    os.symlink("missing.jpg", tmp_path / "imgs" / "c.jpg")
    with pytest.raises(UploadError, match="'c.jpg' .* to nothing"):
        walk(tmp_path / "imgs")


@pytest.mark.parametrize("bad", ["with space.jpg", "ünï.jpg", "semi;colon.jpg", "$(x).jpg"])
def test_walk_refuses_names_check_name_refuses_and_says_which(tmp_path: Path, bad: str) -> None:
    _write(tmp_path / "imgs", {"ok.jpg": b"1", bad: b"2"})
    with pytest.raises(UploadError, match="local_dir: 1 file names") as err:
        walk(tmp_path / "imgs")
    assert repr(bad) in str(err.value)


def test_walk_names_the_argument_for_a_missing_file_or_empty_dir(tmp_path: Path) -> None:
    with pytest.raises(UploadError, match=r"local_dir: '.*nope' does not exist"):
        walk(tmp_path / "nope")
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(UploadError, match="is not a directory"):
        walk(tmp_path / "f")
    (tmp_path / "empty" / "only-dirs").mkdir(parents=True)
    with pytest.raises(UploadError, match="has no files to upload"):
        walk(tmp_path / "empty")


@pytest.mark.parametrize("claim", ["pets-data", "a", "data.v2", "x" * 253])
def test_good_claim_names(claim: str) -> None:
    assert check_claim_name(claim) == claim


@pytest.mark.parametrize("claim", ["", "Pets", "-data", "data-", "a_b", "x" * 254, "a/b", "a..b"])
def test_bad_claim_names_name_the_argument(claim: str) -> None:
    with pytest.raises(UploadError, match=f"claim: {claim!r}"):
        check_claim_name(claim)


def test_claim_dir() -> None:
    assert claim_dir("/") == "" and claim_dir("") == ""
    assert claim_dir("/images/") == "images" and claim_dir("a/b") == "a/b"
    for bad in ("/../etc", "/a/./b", "/a b", "//x//y"):
        with pytest.raises(UploadError, match="path: "):
            claim_dir(bad)


# ----------------------------------------------------------------------------- the plan and the claim


def _entry(name: str, data: bytes) -> LocalFile:
    return LocalFile(name, len(data), _sha(data), Path("/nowhere") / name)


def test_plan_skips_only_what_is_there_with_the_same_size_and_digest() -> None:
    same, changed, new, twice = (_entry("same", b"1"), _entry("changed", b"2"), _entry("new", b"3"),
                                 _entry("twice", b"4"))
    listing = [("same", 1, same.sha256), ("changed", 1, _sha(b"x")), ("unasked", 9, _sha(b"")),
               ("twice", 1, twice.sha256), ("twice", 1, _sha(b"y"))]
    copy_, skip = plan([same, changed, new, twice], listing)
    assert [f.name for f in copy_] == ["changed", "new", "twice"] and skip == [same]
    assert plan([same], [("same", 2, same.sha256)]) == ([same], []), "a size that differs is copied"
    assert plan([same, new], []) == ([same, new], [])


def test_claim_size_is_one_and_a_half_times_the_data_in_whole_gib() -> None:
    assert claim_size(0) == "1Gi" and claim_size(1) == "1Gi"
    assert claim_size(2 * GIB // 3) == "1Gi"  # 1.5x is exactly 1 GiB
    assert claim_size(2 * GIB // 3 + 1) == "2Gi"
    assert claim_size(2 * GIB) == "3Gi" and claim_size(2 * GIB + 1) == "4Gi"
    assert claim_size(800 * 10**6) == "2Gi"  # Oxford-IIIT Pets' images, about 800 MB


def test_an_existing_claim_that_is_too_small_is_refused_with_the_sizes() -> None:
    with pytest.raises(UploadError, match=r"claim: 'small' holds 1Gi \(1.1 GB\), less than the 2.1 GB"):
        check_capacity("small", "1Gi", 2 * GIB)
    check_capacity("fine", "5Gi", 2 * GIB)
    check_capacity("unknown", None, 2 * GIB)
    check_capacity("exact", "2Gi", 2 * GIB)


def test_the_claim_made_asks_for_the_size_on_the_default_class_unless_told() -> None:
    pvc = claim_manifest("d", 3 * GIB, ["ReadWriteMany"])
    assert pvc["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "5Gi"}}}
    assert claim_manifest("d", 1, ["ReadWriteOnce"], "fast")["spec"]["storageClassName"] == "fast"


def test_the_upload_pod_mounts_the_whole_claim_read_write_as_the_trainer() -> None:
    pod = upload_pod("pets-data", "img:1", 10**9, {"nodeSelector": {"pool": "cpu"}, "epochs": 3})
    spec = pod["spec"]
    (c,) = spec["containers"]
    assert c["name"] == "upload" and c["image"] == "img:1"
    assert c["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    assert spec["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "pets-data"}}]
    assert spec["securityContext"]["runAsUser"] == 65532 and spec["securityContext"]["fsGroup"] == 65532
    assert spec["nodeSelector"] == {"pool": "cpu"} and "epochs" not in spec
    assert spec["activeDeadlineSeconds"] == 900 + 2000 and c["command"] == ["sleep", "2900"]
    assert pod["metadata"]["generateName"] == "pets-data-upload-"


# ----------------------------------------------------------------------------- the commands, run here


def _run(command: list[str]) -> subprocess.CompletedProcess[bytes]:
    assert command[:2] == ["sh", "-c"]
    return subprocess.run(command, capture_output=True, check=False)


def _send(root: Path, name: str, data: bytes, chunk_bytes: int = UPLOAD_CHUNK_BYTES,
          per_exec: int = UPLOAD_CHUNKS_PER_EXEC, twice: bool = False) -> subprocess.CompletedProcess[bytes]:
    src = root.parent / "src.bin"
    src.write_bytes(data)
    for first, chunks in exec_groups(read_chunks(src, chunk_bytes), per_exec):
        command = write_command(str(root), name, first, chunks, chunk_bytes)
        assert argv_ok(command)
        for _ in range(2 if twice else 1):  # an exec sent again writes the same bytes
            assert _run(command).returncode == 0
    return _run(commit_command(str(root), name, len(data), _sha(data)))


def test_a_file_sent_in_chunks_is_the_same_file_byte_for_byte(tmp_path: Path) -> None:
    root = tmp_path / "claim"
    root.mkdir()
    data = os.urandom(UPLOAD_CHUNK_BYTES * UPLOAD_CHUNKS_PER_EXEC * 2 + 12345)
    assert _send(root, "sub/dir/big.jpg", data, twice=True).returncode == 0
    assert (root / "sub/dir/big.jpg").read_bytes() == data
    assert not (root / "sub/dir" / ".big.jpg.pets-upload").exists()
    assert _send(root, "empty.jpg", b"").returncode == 0 and (root / "empty.jpg").read_bytes() == b""
    # what is there now is listed with fetch's listing, and a second upload of it copies nothing
    names = ["sub/dir/big.jpg", "empty.jpg", "absent.jpg"]
    listing = parse_listing(_run(list_command(names, str(root))).stdout)
    entries = [_entry("sub/dir/big.jpg", data), _entry("empty.jpg", b""), _entry("absent.jpg", b"z")]
    assert plan(entries, listing) == ([entries[2]], entries[:2])


def test_a_resent_upload_replaces_a_longer_stale_temp_file(tmp_path: Path) -> None:
    root = tmp_path / "claim"
    root.mkdir()
    (root / temp_name("a.jpg")).write_bytes(b"x" * (3 * UPLOAD_CHUNK_BYTES))
    assert _send(root, "a.jpg", b"short").returncode == 0
    assert (root / "a.jpg").read_bytes() == b"short"


def test_a_copy_that_does_not_match_its_digest_is_removed_and_fails(tmp_path: Path) -> None:
    root = tmp_path / "claim"
    root.mkdir()
    (root / "a.jpg").write_bytes(b"old")
    data = os.urandom(3 * UPLOAD_CHUNK_BYTES)
    command = write_command(str(root), "a.jpg", 0, list(read_chunks_of(data)))
    command[-1] = command[-1][:-8] + "AAAAAAAA"  # one chunk damaged on the way
    assert _run(command).returncode == 0
    done = _run(commit_command(str(root), "a.jpg", len(data), _sha(data)))
    assert done.returncode == 4 and b"does not match" in done.stderr
    assert (root / "a.jpg").read_bytes() == b"old", "the file keeps its name only when whole"
    assert not (root / temp_name("a.jpg")).exists()


def read_chunks_of(data: bytes, size: int = UPLOAD_CHUNK_BYTES) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)] or [b""]


def test_every_exec_argument_stays_under_the_kernels_limit() -> None:
    chunks = [os.urandom(UPLOAD_CHUNK_BYTES)] * UPLOAD_CHUNKS_PER_EXEC
    command = write_command("/data/x", "a/" + "n" * 200 + ".jpg", 4, chunks)
    assert argv_ok(command) and max(len(a) for a in command) < MAX_ARG_BYTES * 3 // 4
    assert not argv_ok(["sh", "-c", "x" * MAX_ARG_BYTES]), "the check can fail"
    with pytest.raises(UploadError, match="larger than"):
        write_command("/data", "a.jpg", 0, [b"x" * (UPLOAD_CHUNK_BYTES + 1)])
    names = [f"class_{i}/image_{i}.jpg" for i in range(20_000)]
    batches = listing_batches(names)
    assert len(batches) > 1 and [n for b in batches for n in b] == names
    assert all(argv_ok(list_command(b, "/data")) for b in batches)
    assert all(listing_limit(b) < 4 << 20 for b in batches)


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200), chunk_bytes=st.integers(1, 16), per_exec=st.integers(1, 5))
def test_chunks_reassemble_whatever_the_sizes(tmp_path_factory: pytest.TempPathFactory, data: bytes,
                                              chunk_bytes: int, per_exec: int) -> None:
    root = tmp_path_factory.mktemp("prop") / "claim"
    root.mkdir()
    assert _send(root, "f.bin", data, chunk_bytes, per_exec).returncode == 0
    assert (root / "f.bin").read_bytes() == data


# ----------------------------------------------------------------------------- the client's glue


def _local_run(command: list[str], limit: int, doing: str) -> bytes:
    done = _run(command)
    if done.returncode:
        raise UploadError(f"{doing} failed (exit {done.returncode}): {done.stderr.decode()}")
    return done.stdout


def test_the_client_checks_what_it_sent_against_the_walk(tmp_path: Path) -> None:
    _write(tmp_path / "imgs", {"a.jpg": os.urandom(300_000)})
    (entry,) = walk(tmp_path / "imgs")
    root = tmp_path / "claim"
    root.mkdir()
    advanced: list[int] = []
    PetsTrainingClient._upload_file(_local_run, str(root), entry, advanced.append)
    assert (root / "a.jpg").read_bytes() == entry.path.read_bytes() and sum(advanced) == 300_000
    entry.path.write_bytes(b"changed since the walk")
    with pytest.raises(UploadError, match="changed while it was uploaded"):
        PetsTrainingClient._upload_file(_local_run, str(root), entry, advanced.append)
    lying = LocalFile("b.jpg", 3, _sha(b"abc"), entry.path)  # the pod's check refuses it
    with pytest.raises(UploadError):
        PetsTrainingClient._upload_file(_local_run, str(root), lying, advanced.append)
    assert not (root / "b.jpg").exists()


class _Custom:
    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def create_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.calls.append((args[4], kwargs))
        return args[4]


def _pets(monkeypatch: pytest.MonkeyPatch) -> tuple[PetsTrainingClient, _Custom, list[dict[str, Any]]]:
    pets = PetsTrainingClient.__new__(PetsTrainingClient)
    pets.namespace = "ns"
    pets.custom = _Custom()  # type: ignore[assignment]
    uploads: list[dict[str, Any]] = []
    monkeypatch.setattr(pets, "_call", lambda what, fn, *a, **k: fn(*a, **k))
    def upload(files: list[Any], claim: str, sub: str, **kw: Any) -> UploadResult:
        uploads.append({"files": [f.name for f in files], "claim": claim, "sub": sub} | kw)
        return UploadResult(claim=claim, path="/" + sub, copied=len(files), skipped=0, bytes_copied=1,
                            created_claim=True)

    monkeypatch.setattr(pets, "_upload", upload)
    return pets, pets.custom, uploads  # type: ignore[return-value]


def test_train_with_a_folder_uploads_then_creates_on_the_claim(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path / "imgs", {"cat_1.jpg": b"c"})
    pets, custom, uploads = _pets(monkeypatch)
    name = pets.train({"epochs": 1}, name="pets", dataset=str(tmp_path / "imgs"), dataset_path="/v1",
                      replicas=2)
    assert name == "pets"
    (dry, dry_kw), (body, kw) = custom.calls
    assert dry_kw == {"dry_run": "All"} and kw == {}
    assert body["spec"]["dataset"] == {"persistentVolumeClaim": {"claimName": "pets-data", "path": "/v1"}}
    assert body["spec"]["replicas"] == 2 and "datasetPath" not in body["spec"]
    (up,) = uploads
    assert up["claim"] == "pets-data" and up["sub"] == "v1" and up["files"] == ["cat_1.jpg"]
    assert up["access_modes"] == ["ReadWriteMany"] and up["image"] == "pets-training/trainer:0.1.0"


def test_train_with_a_folder_and_no_name_picks_one_for_the_claim(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path / "imgs", {"cat_1.jpg": b"c"})
    pets, custom, uploads = _pets(monkeypatch)
    name = pets.train(dataset=tmp_path / "imgs", dataset_claim="mine")
    assert name.startswith("pets-") and len(name) == 10 and name == custom.calls[-1][0]["metadata"]["name"]
    assert "generateName" not in custom.calls[-1][0]["metadata"]
    assert uploads[0]["claim"] == "mine" and uploads[0]["access_modes"] == ["ReadWriteOnce"]


def test_train_with_a_bad_folder_or_claim_creates_nothing(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    pets, custom, uploads = _pets(monkeypatch)
    with pytest.raises(UploadError, match="local_dir: .* does not exist"):
        pets.train(name="p", dataset=str(tmp_path / "none"))
    _write(tmp_path / "imgs", {"a.jpg": b"a"})
    with pytest.raises(UploadError, match="claim: 'Bad_Claim'"):
        pets.train(name="p", dataset=str(tmp_path / "imgs"), dataset_claim="Bad_Claim")
    with pytest.raises(UploadError, match="go with dataset=DIR"):
        pets.train(name="p", dataset_claim="c")
    assert custom.calls == [] and uploads == []
    pets.train(name="p", dataset={"synthetic": {}})  # a dict is still the spec field
    assert custom.calls[-1][0]["spec"]["dataset"] == {"synthetic": {}} and uploads == []


def test_upload_checks_its_arguments_before_anything_is_created(tmp_path: Path) -> None:
    pets = PetsTrainingClient.__new__(PetsTrainingClient)  # no API objects: any call would fail
    _write(tmp_path / "imgs", {"a.jpg": b"a"})
    with pytest.raises(UploadError, match="claim: 'A'"):
        pets.upload(tmp_path / "imgs", claim="A")
    with pytest.raises(UploadError, match="path: '/../x'"):
        pets.upload(tmp_path / "imgs", claim="a", path="/../x")
    with pytest.raises(UploadError, match="local_dir: .*'"):
        pets.upload(tmp_path / "none", claim="a")


# ----------------------------------------------------------------------------- the plugin


def test_upload_arguments() -> None:
    args = cli.parser().parse_args(["upload", "imgs", "--claim", "pets-data", "--path", "/v1", "-n", "ml"])
    assert (args.command, args.dir, args.claim, args.path, args.namespace) == ("upload", "imgs", "pets-data",
                                                                               "/v1", "ml")
    defaults = cli.parser().parse_args(["upload", "imgs", "--claim", "c"])
    assert defaults.path == "/" and defaults.access_mode is None and defaults.image is None
    with pytest.raises(SystemExit) as err:
        cli.parser().parse_args(["upload", "imgs"])
    assert err.value.code == 2


def test_run_data_arguments() -> None:
    args = cli.parser().parse_args(["run", "-f", "t.yaml", "--data", "imgs", "--claim", "c", "--data-path",
                                    "/v1"])
    assert (args.data, args.claim, args.data_path) == ("imgs", "c", "/v1")
    assert cli.parser().parse_args(["run", "-f", "t.yaml"]).data is None
    with pytest.raises(SystemExit) as err:
        cli.main(["run", "-f", "t.yaml", "--claim", "c"])
    assert err.value.code == 2


class _FakePets:
    namespace = "ns"

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def train(self, *a: Any, **k: Any) -> str:
        self.calls.append(("train", a, k))
        return "pets"

    def upload(self, *a: Any, **k: Any) -> UploadResult:
        self.calls.append(("upload", a, k))
        return UploadResult("c", "/v1", copied=3, skipped=2, bytes_copied=2_500_000)


def test_the_plugin_passes_the_folder_on_and_prints_the_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fake = _FakePets()
    monkeypatch.setattr(cli, "_client", lambda args: fake)
    assert cli.main(["upload", "imgs", "--claim", "c", "--path", "/v1",
                     "--access-mode", "ReadWriteOnce"]) == 0
    assert capsys.readouterr().out == ("copied 3 files / 2.5 MB into claim c path /v1, "
                                       "skipped 2 already there\n")
    assert fake.calls[-1][1:] == (("imgs",), {"claim": "c", "path": "/v1", "image": None,
                                              "access_modes": ["ReadWriteOnce"], "storage_class": None})
    (tmp_path / "t.yaml").write_text("spec: {epochs: 1}\n")
    assert cli.main(["run", "-f", str(tmp_path / "t.yaml"), "--data", "imgs"]) == 0
    assert fake.calls[-1][2] == {"name": None, "dataset": "imgs", "dataset_claim": None, "dataset_path": "/"}
    assert cli.main(["run", "-f", str(tmp_path / "t.yaml")]) == 0
    assert fake.calls[-1][2] == {"name": None}
