"""Nothing a fetch pod sends can write outside the destination (issue 28).

The fetch pod runs the training's image, so its listing and its chunks are not trusted: the names it
lists must be the names asked for (each once), every name is checked and resolved under the
destination whatever its size, no symlink already in the destination is written through, and no
more bytes are read than the listing declares. The checks are pure functions, tested here directly;
then `collect` (fetch's local half), `fetch` and `plot` themselves with a fake pod, each against a
snapshot of a temp tree around the destination that must not change when a listing is refused.
"""

from __future__ import annotations

import base64
import hashlib
import os
import random
from pathlib import Path
from typing import Any

import pytest

from pets_client import _api
from pets_client.client import PetsTrainingClient
from pets_client.errors import FetchError
from pets_client.plot import plot_progress, read_progress
from pets_client.transfer import (
    CHUNK_BYTES,
    CHUNK_OUTPUT_BYTES,
    MAX_FETCH_FILE_BYTES,
    assemble,
    check_listing,
    check_name,
    collect,
    list_request,
    parse_list,
    save,
    target_path,
)

from .tree import snapshot

pytestmark = pytest.mark.unit

WANTED = list(_api.OUTPUT_FILES)


# ----------------------------------------------------------------------------- helpers


def _line(name: str, data: bytes) -> bytes:
    """The two lines the listing (list_request) prints for a file: its size, then its digest."""
    return f"S {len(data)} {name}\n{hashlib.sha256(data).hexdigest()}  {name}\n".encode()


def _listing(files: dict[str, bytes]) -> bytes:
    return b"".join(_line(n, d) for n, d in files.items())


def _chunks(files: dict[str, bytes]) -> Any:
    def read_chunk(name: str, index: int) -> bytes:
        return files[name][index * CHUNK_BYTES:(index + 1) * CHUNK_BYTES]
    return read_chunk


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """tmp_path/outside (files a hostile pod would like to write), tmp_path/home/.ssh, and
    tmp_path/dest, the destination, holding an earlier fetch and a link that leads out of it."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "victim").write_text("do not touch")
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "home" / ".ssh" / "authorized_keys").write_text("ssh-ed25519 AAAA mine\n")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "summary.json").write_text('{"old": true}')
    (dest / "escape").symlink_to(tmp_path / "outside")
    return tmp_path


# ----------------------------------------------------------------------------- the pure checks


@pytest.mark.parametrize("name", ["summary.json", "checkpoints/epoch_1/model.safetensors", ".hidden",
                                  "a-b_c.d", "..x", "x.."])
def test_check_name_takes_plain_relative_names(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/../b", "a/..", "/etc/passwd", "//x", "a//b",
                                  "a/", "./a", "a/./b", "a\x00b", "summary.json\n", "a\nb", "é.json",
                                  "a\\b", "..\\x", "C:x", "a b", "$(x)", "a;b"])
def test_check_name_refuses_anything_else(name: str) -> None:
    with pytest.raises(FetchError, match="cannot fetch"):
        check_name(name)


def test_check_name_refuses_what_is_not_a_string() -> None:
    with pytest.raises(FetchError):
        check_name(b"summary.json")  # type: ignore[arg-type]


def test_parse_list_keeps_well_formed_lines_only() -> None:
    digest = "a" * 64
    text = (f"S 12 summary.json\n{digest}  summary.json\n"
            f"S \u00b2 progress.jsonl\n{digest}  progress.jsonl\n"    # a digit to str.isdigit, not to int()
            f"S \u0661\u0662 metrics.png\n{digest}  metrics.png\n"  # Arabic-Indic digits
            f"S 3 config.yaml\n{'A' * 64}  config.yaml\n"             # not lower-case hex
            f"S 99999999999999999999999 big\n{digest}  big\n"         # more than 20 digits
            f"S 5 unhashed\n"                                         # a size without its digest
            f"S 4 two\r\n{digest}  two\r\n"
            "garbage\n").encode()
    assert parse_list(text) == [("summary.json", 12, digest), ("two\r", 4, digest)]


def test_a_listing_may_only_name_what_was_asked_for() -> None:
    ok = [("summary.json", 2, "0" * 64), ("model.safetensors", 0, "1" * 64)]
    assert check_listing(WANTED, ok) == ok
    assert check_listing(WANTED, []) == []
    for name in (".ssh/authorized_keys", "../x", "/etc/cron.d/x", "summary.json\r", "Summary.json"):
        with pytest.raises(FetchError, match="was not asked for") as err:
            check_listing(WANTED, [("summary.json", 2, "0" * 64), (name, 0, "0" * 64)])
        assert repr(name) in str(err.value)


def test_a_listing_may_name_a_file_once() -> None:
    with pytest.raises(FetchError, match="'summary.json' twice"):
        check_listing(WANTED, [("summary.json", 2, "0" * 64), ("summary.json", 0, "0" * 64)])


def test_a_listed_size_above_the_cap_is_refused() -> None:
    assert check_listing(WANTED, [("model.safetensors", MAX_FETCH_FILE_BYTES, "0" * 64)])
    with pytest.raises(FetchError, match="'model.safetensors' at"):
        check_listing(WANTED, [("model.safetensors", MAX_FETCH_FILE_BYTES + 1, "0" * 64)])
    with pytest.raises(FetchError, match="'m' at 11 bytes"):
        check_listing(["m"], [("m", 11, "0" * 64)], max_bytes=10)


def test_a_name_asked_for_is_still_checked() -> None:
    with pytest.raises(FetchError, match="cannot fetch '../x'"):
        check_listing(["../x"], [("../x", 0, "0" * 64)])


def test_target_path_resolves_under_the_destination(tree: Path) -> None:
    dest = tree / "dest"
    assert target_path(dest, "summary.json") == dest.resolve() / "summary.json"
    assert target_path(dest, "new/dir/file") == dest.resolve() / "new" / "dir" / "file"
    # a link that stays inside is followed for the parents, and the file's own name is kept
    (dest / "sub").mkdir()
    (dest / "inner").symlink_to(dest / "sub")
    assert target_path(dest, "inner/f") == dest.resolve() / "sub" / "f"
    (dest / "alias").symlink_to(dest / "summary.json")
    assert target_path(dest, "alias") == dest.resolve() / "alias"
    # the destination itself may be a link: it is resolved first
    (tree / "dest-link").symlink_to(dest)
    assert target_path(tree / "dest-link", "summary.json") == dest.resolve() / "summary.json"


@pytest.mark.parametrize("name", ["escape/victim", "escape/new", "escape/a/b", "up/x", "root/etc/passwd",
                                  "out-file", "dangling", "self", "loop/x"])
def test_target_path_refuses_a_link_that_leads_out(tree: Path, name: str) -> None:
    dest = tree / "dest"
    (dest / "up").symlink_to("..")
    (dest / "root").symlink_to("/")
    (dest / "out-file").symlink_to(tree / "outside" / "victim")
    (dest / "dangling").symlink_to(tree / "outside" / "not-yet")
    (dest / "self").symlink_to(".")
    (dest / "loop").symlink_to("loop")
    with pytest.raises(FetchError) as err:
        target_path(dest, name)
    assert repr(name) in str(err.value)


@pytest.mark.parametrize("name", ["../x", "/abs", "a/../../x", ""])
def test_target_path_checks_the_name_first(tree: Path, name: str) -> None:
    with pytest.raises(FetchError, match="cannot fetch"):
        target_path(tree / "dest", name)


def test_a_chunk_longer_than_listed_is_refused_at_once() -> None:
    reads: list[int] = []

    def longer(index: int) -> bytes:
        reads.append(index)
        return b"x" * 11

    with pytest.raises(FetchError, match="chunk 0 came back with 11 bytes, more than the 10"):
        assemble("summary.json", 10, "0" * 64, longer)
    assert reads == [0], "a longer chunk is not read again"


def test_nothing_is_read_for_an_empty_file_but_its_digest_is_checked() -> None:
    assert assemble("e", 0, hashlib.sha256(b"").hexdigest(), lambda i: pytest.fail("read")) == b""
    with pytest.raises(FetchError, match="sha256"):
        assemble("e", 0, "0" * 64, lambda i: b"")


def test_the_listing_limit_fits_the_listing_of_every_file() -> None:
    files = ["summary.json", "checkpoints/epoch_12/model.safetensors"]
    longest = _listing({f: b"" for f in files}).replace(b"S 0 ", b"S " + b"9" * 20 + b" ")
    assert list_request("/output", files)[2] >= len(longest)
    assert CHUNK_OUTPUT_BYTES >= len(base64.b64encode(b"\xff" * CHUNK_BYTES))


# ----------------------------------------------------------------------------- save and collect


def test_save_replaces_rather_than_writes_through(tree: Path) -> None:
    dest = tree / "dest"
    # a hard link in the destination to a file outside it: replaced, the outside file untouched
    os.link(tree / "outside" / "victim", dest / "metrics.png")
    path = save(dest, "metrics.png", b"png")
    assert path == dest / "metrics.png" and path.read_bytes() == b"png"
    assert (tree / "outside" / "victim").read_text() == "do not touch"
    # a link that stays inside is replaced by the file, its target left as it was
    (dest / "config.yaml").symlink_to(dest / "summary.json")
    save(dest, "config.yaml", b"a: 1\n")
    assert not (dest / "config.yaml").is_symlink()
    assert (dest / "summary.json").read_text() == '{"old": true}'
    # directories are made as needed; no temp file is left behind
    assert save(dest, "checkpoints/epoch_1/model.safetensors", b"m").read_bytes() == b"m"
    assert not [p for p in dest.rglob("*.part")]


def test_save_refuses_a_link_out_and_a_bad_name_whatever_the_size(tree: Path) -> None:
    before = snapshot(tree)
    absolute = str(tree / "outside" / "victim")
    for name in ("escape/victim", "escape/new/file", "../outside/victim", "/abs", absolute):
        for data in (b"", b"pwned"):
            with pytest.raises(FetchError) as err:
                save(tree / "dest", name, data)
            assert repr(name) in str(err.value)
    assert snapshot(tree) == before


def test_save_refuses_a_file_where_a_directory_is_needed(tree: Path) -> None:
    with pytest.raises(FetchError, match="'summary.json/x'"):
        save(tree / "dest", "summary.json/x", b"x")


def test_collect_writes_what_was_asked_for(tree: Path) -> None:
    files = {"summary.json": b'{"final_accuracy": 0.9}', "model.safetensors": os.urandom(CHUNK_BYTES + 5),
             "config.yaml": b""}
    got = collect(tree / "dest", WANTED, _listing(files), _chunks(files))
    assert [p.name for p in got] == list(files)
    for name, data in files.items():
        assert (tree / "dest" / name).read_bytes() == data
    assert collect(tree / "dest", WANTED, b"", _chunks(files)) == []


HOSTILE = {
    "an unrequested name": ({"summary.json": b"{}", ".ssh/authorized_keys": b"ssh-ed25519 AAAA evil\n"},
                            ".ssh/authorized_keys"),
    "a ../ name": ({"summary.json": b"{}", "../outside/victim": b"pwned"}, "../outside/victim"),
    "an empty ../ name": ({"../outside/victim": b""}, "../outside/victim"),
    "an empty absolute name": ({"summary.json": b"{}", "{tree}/outside/victim": b""},
                               "{tree}/outside/victim"),
    "an absolute name": ({"{tree}/home/.ssh/authorized_keys": b"evil"}, "{tree}/home/.ssh/authorized_keys"),
    "a duplicate": ({"summary.json": b"{}", "progress.jsonl": b""}, "progress.jsonl"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_listing_fails_naming_the_entry_and_writes_nothing(tree: Path, case: str) -> None:
    files, bad = HOSTILE[case]
    files = {n.replace("{tree}", str(tree)): d for n, d in files.items()}
    bad = bad.replace("{tree}", str(tree))
    listing = _listing(files) + (_line("progress.jsonl", b"") if case == "a duplicate" else b"")
    before = snapshot(tree)
    with pytest.raises(FetchError) as err:
        collect(tree / "dest", WANTED, listing, _chunks(files))
    assert repr(bad) in str(err.value)
    assert snapshot(tree) == before


def test_a_link_in_the_destination_that_leads_out_is_refused(tree: Path) -> None:
    # the user asked for a file under a directory that is, in the destination, a link out of it
    files = {"summary.json": b"{}", "escape/victim": b"pwned"}
    before = snapshot(tree)
    with pytest.raises(FetchError, match="'escape/victim'.*outside"):
        collect(tree / "dest", ["summary.json", "escape/victim"], _listing(files), _chunks(files))
    assert snapshot(tree) == before, "checked before the first file is written"


# ----------------------------------------------------------------------------- fetch and plot themselves


class FakeCore:
    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.deleted: list[str] = []

    def create_namespaced_pod(self, namespace: str, body: dict[str, Any]) -> Any:
        self.created.append(body)
        meta = type("Meta", (), {"name": "pets-fetch-abcde"})()
        return type("Pod", (), {"metadata": meta})()

    def delete_namespaced_pod(self, name: str, namespace: str, **_: Any) -> None:
        self.deleted.append(name)


def _client(monkeypatch: pytest.MonkeyPatch, files: dict[str, bytes], listing: bytes | None = None,
            chunk_text: Any = None) -> tuple[PetsTrainingClient, FakeCore]:
    """A client whose training writes to a claim and whose fetch pod prints ``listing`` (default: the
    listing of ``files``) and serves ``files`` in chunks, as a pod of the training's image might."""
    pets = PetsTrainingClient.__new__(PetsTrainingClient)
    pets.namespace = "ns"
    core = FakeCore()
    pets.core = core
    training = {"metadata": {"name": "pets"},
                "spec": {"output": {"persistentVolumeClaim": {"claimName": "c"}}}}
    limits: list[int] = []

    def exec_bytes(pod: str, command: list[str], limit: int, stdin: bytes = b"") -> bytes:
        limits.append(limit)
        if (command, stdin) == list_request(_api.OUTPUT_DIR, stdin.decode().splitlines())[:2]:
            return _listing(files) if listing is None else listing
        name, index = command[4], int(command[5])
        if chunk_text is not None:
            return bytes(chunk_text(name, index))
        return base64.b64encode(files[name][index * CHUNK_BYTES:(index + 1) * CHUNK_BYTES])

    monkeypatch.setattr(pets, "get", lambda name: training)
    monkeypatch.setattr(pets, "_trainer_image", lambda t: "img:1")
    monkeypatch.setattr(pets, "_call", lambda what, fn, *a, **k: fn(*a, **k))
    monkeypatch.setattr(pets, "_wait_pod_running", lambda pod, timeout: None)
    monkeypatch.setattr(pets, "_exec_bytes", exec_bytes)
    pets.limits = limits  # type: ignore[attr-defined]
    return pets, core


def test_fetch_refuses_a_hostile_listing_and_deletes_its_pod(tree: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    files = {"summary.json": b"{}", ".ssh/authorized_keys": b"evil", "../outside/victim": b""}
    pets, core = _client(monkeypatch, files)
    before = snapshot(tree)
    with pytest.raises(FetchError, match="'.ssh/authorized_keys', which was not asked for"):
        pets.fetch("pets", tree / "dest")
    assert snapshot(tree) == before
    assert core.deleted == ["pets-fetch-abcde"]


def test_fetch_reads_no_more_than_the_listing_says(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = {"summary.json": b'{"a": 1}'}
    pets, _ = _client(monkeypatch, files)
    assert pets.fetch("pets", tree / "dest") == [tree / "dest" / "summary.json"]
    assert (tree / "dest" / "summary.json").read_bytes() == files["summary.json"]
    assert pets.limits == [list_request(_api.OUTPUT_DIR, WANTED)[2], CHUNK_OUTPUT_BYTES]  # type: ignore[attr-defined]
    # a pod that sends more than the file it listed: refused, nothing written
    pets, _ = _client(monkeypatch, files, chunk_text=lambda n, i: base64.b64encode(b'{"a": 1}' + b" " * 99))
    before = snapshot(tree)
    with pytest.raises(FetchError, match="more than the 8 the listing says"):
        pets.fetch("pets", tree / "dest")
    assert snapshot(tree) == before


def test_plot_goes_through_the_same_checks(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    evil = {"progress.jsonl": b"", "../../outside/victim": b""}
    pets, core = _client(monkeypatch, evil)
    before = snapshot(tree)
    with pytest.raises(FetchError, match="'../../outside/victim', which was not asked for"):
        pets.plot("pets", tree / "dest" / "curves.png")
    assert snapshot(tree) == before
    assert core.created[0]["metadata"]["annotations"][f"{_api.GROUP}/files"] == "progress.jsonl"
    # a progress.jsonl of any bytes is read, and only numbers are plotted
    hostile = (b'{"epoch": 1, "train_loss": 1.5, "eval_accuracy": 0.5}\n\xff\xfe\x1b[2J\n'
               + b"[" * 100_000 + b"\n"
               + b'{"epoch": 2, "train_loss": "x", "eval_accuracy": [1, 2, 3]}\n'
               + b'{"epoch": 3, "train_loss": 1e999, "eval_accuracy": 0.7}\n'
               + b'{"epoch": 100000000000000000000, "train_loss": 1}\n{"epoch": true}\n')
    pets, _ = _client(monkeypatch, {"progress.jsonl": hostile})
    out = pets.plot("pets", tree / "plots" / "curves.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [r["epoch"] for r in read_progress(hostile.decode(errors="replace"))] == [1, 2, 3]


def test_plot_of_many_epochs_leaves_the_ticks_to_matplotlib(tmp_path: Path) -> None:
    records = [{"epoch": e, "train_loss": 1.0 / e, "eval_accuracy": 0.5} for e in range(1, 2001)]
    assert plot_progress(records, tmp_path / "p.png").stat().st_size > 0


# ----------------------------------------------------------------------------- random names (no hypothesis)

PARTS = ["a", "b.json", "..", ".", "", "escape", "up", "root", "self", "inner", "loop", "dangling", "é",
         "\x00", "a\x00b", "\\", "..\\..", "~", "-", "..a", "C:", "\n", " ", "日本", "%2e%2e", "\u202e"]


def _random_name(rng: random.Random) -> str:
    name = "/".join(rng.choice(PARTS) for _ in range(rng.randint(1, 5)))
    return ("/" + name) if rng.random() < 0.15 else name


def test_no_random_name_lands_outside_the_destination(tree: Path) -> None:
    """A seeded stand-in for a hypothesis property (hypothesis is not installed): whatever the name,
    target_path either refuses it or returns a path whose every link resolves inside the destination."""
    dest = tree / "dest"
    (dest / "up").symlink_to("..")
    (dest / "root").symlink_to("/")
    (dest / "self").symlink_to(".")
    (dest / "loop").symlink_to("loop")
    (dest / "dangling").symlink_to(tree / "outside" / "nothing")
    (dest / "sub").mkdir()
    (dest / "inner").symlink_to(dest / "sub")
    root = dest.resolve()
    rng = random.Random(20261124)
    accepted = 0
    for _ in range(20_000):
        name = _random_name(rng)
        try:
            path = target_path(dest, name)
        except FetchError:
            continue
        accepted += 1
        real = Path(os.path.realpath(path))
        assert real != root and real.is_relative_to(root), name
        assert path.parent.is_relative_to(root) and path.name == name.split("/")[-1], name
    assert accepted > 500, "the generator should also make names that pass"


def test_saving_random_names_changes_nothing_outside(tree: Path) -> None:
    dest = tree / "dest"
    (dest / "up").symlink_to("..")
    (dest / "inner").symlink_to(dest)
    outside = {p: s for p, s in snapshot(tree).items() if not p.startswith("dest")}
    rng = random.Random(28)
    for _ in range(500):
        name = _random_name(rng)
        try:
            save(dest, name, b"")
        except FetchError:
            pass
    assert {p: s for p, s in snapshot(tree).items() if not p.startswith("dest")} == outside
