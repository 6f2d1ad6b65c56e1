"""upload's pure parts (issue 23): the local tree, the names, the plan, the claim size, the helper pod,
and the CLI's arguments (the transport: test_upload_batches.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from pets_client import UploadError, cli
from pets_client.client import PetsTrainingClient
from pets_client.upload import (
    GIB,
    LocalFile,
    UploadResult,
    check_capacity,
    check_claim_name,
    claim_dir,
    claim_manifest,
    claim_size,
    plan,
    pod_lifetime,
    upload_pod,
    walk,
)
from pets_contract.names import DEFAULT_IMAGE

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


def test_the_pods_deadline_grows_with_files_and_bytes() -> None:
    assert pod_lifetime(0) == 900 and pod_lifetime(10**9) == 2900
    assert pod_lifetime(0, 5000) == 1400 and pod_lifetime(10**9, 7390) == 2900 + 739
    assert pod_lifetime(10**14, 10**9) == 86400
    assert upload_pod("c", "i", 0, files=5000)["spec"]["activeDeadlineSeconds"] == 1400


# ----------------------------------------------------------------------------- the client's glue


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
    assert up["access_modes"] == ["ReadWriteMany"] and up["image"] == DEFAULT_IMAGE


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
