"""Property tests (issue 28): nothing a fetch pod lists or sends, and no name a user asks for, gets a
write outside the destination. Hypothesis generates the names (any text: '..', '/', absolute paths, NUL,
unicode, empty), the listings (names, sizes and digests, true or not), the chunks, and the destination
itself: a temp tree whose `dest` holds links that lead out of it, stay inside it, dangle or loop.

Whatever they are, `check_name`, `parse_list`, `check_listing`, `target_path`, `assemble`, `save` and
`collect` return what they promise or raise FetchError (never another exception), and a snapshot of the
temp tree around the destination shows nothing outside it changed. Each example makes its own
tempfile.TemporaryDirectory (hypothesis runs a test body many times; a pytest tmp_path would be shared).
`derandomize=True`: CI runs the same examples every time; no example database.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from pets_client import _api
from pets_client.errors import FetchError
from pets_client.transfer import (
    CHUNK_BYTES,
    CHUNK_TRIES,
    MAX_FETCH_FILE_BYTES,
    assemble,
    check_listing,
    check_name,
    collect,
    decode_chunk,
    parse_list,
    save,
    target_path,
)

from .tree import snapshot

pytestmark = pytest.mark.unit

PURE = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])
ON_DISK = settings(PURE, max_examples=100)  # each example builds a temp tree
WANTED = list(_api.OUTPUT_FILES)
# What check_name promises, written independently of its regex: ASCII letters, digits, '_', '.', '-'
# and '/', not absolute, no empty, '.' or '..' part.
PLAIN = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-/")


def plain(name: object) -> bool:
    return (isinstance(name, str) and bool(name) and set(name) <= PLAIN
            and all(p not in ("", ".", "..") for p in name.split("/")))


# ----------------------------------------------------------------------------- strategies

# The links the generated destination may hold (see `tree`), and parts that mean something to a path.
LINK_NAMES = ["escape", "up", "root", "self", "loop", "dangling", "inner", "out-file", "alias", "chain",
              "sub/up2", "sub/back"]
PARTS = st.one_of(
    st.sampled_from([*LINK_NAMES, "sub", "a", "b.json", "summary.json", "victim", "authorized_keys", ".ssh",
                     "outside", "home", "dest", "..", ".", "", "~", "-", "..a", "a..", ".hidden", "C:", "é",
                     "日本", "\x00", "a\x00b", "\\", "..\\..", "\n", " ", "%2e%2e", "\u202e", "x" * 300]),
    st.text(max_size=6),
    st.text(alphabet=sorted(PLAIN - {"/"}), min_size=1, max_size=8),
)
PATHS = st.builds(lambda parts, absolute: ("/" if absolute else "") + "/".join(parts),
                  st.lists(PARTS, min_size=1, max_size=5), st.booleans())
NAMES = st.one_of(PATHS, PATHS, st.text(), st.sampled_from(WANTED), st.text(alphabet=sorted(PLAIN)))
# What a user asks to fetch: the outputs, names through the destination's links, or anything at all.
ASKED = st.one_of(st.sampled_from([*WANTED, "sub/a.json", "new/dir/f", "inner/f", "escape/victim", "alias",
                                   "up/outside/victim", "chain/x", "self/x", "dangling", "sub/back/x"]),
                  NAMES)


# ----------------------------------------------------------------------------- the destination


def outside_of_dest(snap: dict[str, tuple[Any, ...]]) -> dict[str, tuple[Any, ...]]:
    return {rel: v for rel, v in snap.items() if rel != "dest" and not rel.startswith("dest/")}


# Where each link of the destination may point; "{base}" is the temp dir, "{dest}" the destination,
# "{link}" the link itself (a loop). All but "up-up" (the temp dir's parent) stay in the temp dir, where a
# write through them would show in its snapshot; a path through "up-up" is caught by its resolution.
TARGETS = {"..": "..", "../outside": "../outside", "outside": "{base}/outside",
           "victim": "{base}/outside/victim",
           "ssh": "{base}/home/.ssh", "nothing": "{base}/outside/nothing", ".": ".", "self-loop": "{link}",
           "sub": "{dest}/sub", "rel-sub": "sub", "summary": "{dest}/summary.json", "nowhere": "nowhere",
           "sub-up": "sub/../..", "chain": "escape", "dest": "{dest}", "up-up": "../.."}
LINKS = st.dictionaries(st.sampled_from(LINK_NAMES), st.sampled_from(sorted(TARGETS)),
                        max_size=len(LINK_NAMES))


@contextmanager
def tree(links: dict[str, str], *, with_root: bool = False) -> Iterator[Path]:
    """A fresh temp dir: outside/victim, home/.ssh/authorized_keys (what a hostile pod would like to
    write), dest/ (the destination: an earlier fetch's summary.json, a sub/ directory, and ``links``,
    each named by its TARGETS key) and dest-link -> dest. With ``with_root``, dest/root -> / as well."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "outside").mkdir()
        (base / "outside" / "victim").write_text("do not touch")
        (base / "home" / ".ssh").mkdir(parents=True)
        (base / "home" / ".ssh" / "authorized_keys").write_text("ssh-ed25519 AAAA mine\n")
        dest = base / "dest"
        (dest / "sub").mkdir(parents=True)
        (dest / "summary.json").write_text('{"old": true}')
        for name, key in links.items():
            link = dest / name
            target = TARGETS[key].format(base=base, dest=dest, link=link.name)
            if not link.parent.exists():
                link.parent.mkdir(parents=True)
            link.symlink_to(target)
        if with_root and not (dest / "root").is_symlink():
            (dest / "root").symlink_to("/")
        (base / "dest-link").symlink_to(dest)
        yield base


def assert_lands_inside(path: Path, root: Path, name: str) -> None:
    """``path``, and whatever it resolves to through the links now there, lies inside ``root``."""
    real = Path(os.path.realpath(path))
    assert real != root and real.is_relative_to(root), (name, real)
    assert Path(os.path.realpath(path.parent)).is_relative_to(root), (name, path)


# ----------------------------------------------------------------------------- the pure checks


@PURE
@given(NAMES)
@example("")
@example("..")
@example("/etc/passwd")
@example("a\x00b")
@example("summary.json\n")
@example("é.json")
def test_check_name_returns_a_plain_name_or_raises_fetch_error(name: str) -> None:
    try:
        got = check_name(name)
    except FetchError:
        assert not plain(name), name
        event("refused")
        return
    event("accepted")
    assert got is name and plain(name), name


@PURE
@given(st.one_of(st.binary(), st.integers(), st.none(), st.lists(st.text(), max_size=2), st.floats(),
                 st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2)))
def test_check_name_of_what_is_not_a_string_raises_fetch_error(name: Any) -> None:
    with pytest.raises(FetchError):
        check_name(name)


LISTING_LINES = st.one_of(
    st.builds(lambda size, name: f"S {size} {name}", st.one_of(
        st.integers(0, 10**20), st.integers(), st.sampled_from(["", "-1", "1e3", "0x10", "١"])), NAMES),
    st.builds(lambda digest, name: f"{digest}  {name}",
              st.one_of(st.text(alphabet="0123456789abcdef", min_size=64, max_size=64), st.text(max_size=70)),
              NAMES))


@PURE
@given(st.one_of(st.binary(), st.lists(st.one_of(LISTING_LINES, st.text()), max_size=8).map(
    lambda lines: "\n".join(lines).encode("utf-8", "surrogatepass"))))
def test_parse_list_of_any_bytes_gives_well_formed_entries(text: bytes) -> None:
    for name, size, digest in parse_list(text):
        assert isinstance(name, str) and name and "\n" not in name
        assert type(size) is int and 0 <= size < 10**20
        assert re.fullmatch("[0-9a-f]{64}", digest)


ENTRY_SIZES = st.one_of(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(),
                        st.sampled_from([-1, 0, MAX_FETCH_FILE_BYTES, MAX_FETCH_FILE_BYTES + 1, 10**20 - 1]))


@PURE
@given(st.lists(ASKED, max_size=6), st.data(),
       st.one_of(st.just(MAX_FETCH_FILE_BYTES), st.integers(0, 2**40)))
def test_check_listing_takes_only_what_was_asked_each_once_within_the_cap(
        wanted: list[str], data: st.DataObject, max_bytes: int) -> None:
    asked = [w for w in wanted if plain(w)]
    honest = bool(asked) and data.draw(st.booleans(), label="honest")
    if honest:  # the pod lists some of what was asked, each once
        listing = data.draw(st.lists(st.tuples(st.sampled_from(asked), st.integers(0, max_bytes),
                                               st.text(max_size=64)), unique_by=lambda e: e[0]))
    else:
        names = st.one_of(st.sampled_from(wanted), NAMES) if wanted else NAMES
        listing = data.draw(st.lists(st.tuples(names, ENTRY_SIZES, st.text(max_size=64)), max_size=6))
    try:
        got = check_listing(wanted, listing, max_bytes)
    except FetchError:
        event("refused")
        return
    event(f"accepted {len(got)}")
    assert got == listing
    assert len({name for name, _, _ in got}) == len(got), "each name once"
    for name, size, _ in got:
        assert name in wanted and plain(name) and check_name(name) == name
        assert 0 <= size <= max_bytes


@PURE
@given(st.binary(max_size=200))
@example(b"\xff" * 8)
@example("é".encode())
def test_decode_chunk_of_any_bytes_is_bytes_never_an_error(encoded: bytes) -> None:
    got = decode_chunk(encoded)
    assert type(got) is bytes and len(got) <= len(encoded) * 3 // 4
    if got:
        assert base64.b64decode(encoded.strip(), validate=True) == got


FILES = st.one_of(st.binary(max_size=64), st.binary(min_size=1, max_size=3).map(
    lambda b: (b * (CHUNK_BYTES // len(b) + 2))[:CHUNK_BYTES + 2]))  # past one chunk


@PURE
@given(FILES, st.one_of(st.sampled_from([0, 0, 0, 1, -1]), st.integers(-80, 80)), st.booleans(),
       st.lists(st.one_of(st.integers(-3, 3), st.integers(0, 0), st.binary(max_size=80)), max_size=8))
def test_assemble_gives_the_listed_file_whole_or_raises_fetch_error(data: bytes, lie: int, true_digest: bool,
                                                                   answers: list[bytes | int]) -> None:
    """The listing's size (``lie`` bytes off the file's, never below 0: check_listing refuses that) and
    digest may be true or not; the pod answers each chunk read with the next of ``answers``: bytes of its
    own, or the true chunk cut or padded by a few bytes (an int, 0: the true chunk)."""
    size = max(0, len(data) + lie)
    digest = hashlib.sha256(data).hexdigest() if true_digest else hashlib.sha256(data + b"x").hexdigest()
    reads: list[int] = []

    def read_chunk(index: int) -> bytes:
        answer = answers[len(reads) % len(answers)] if answers else 0
        reads.append(index)
        if isinstance(answer, bytes):
            return answer
        chunk = data[index * CHUNK_BYTES:(index + 1) * CHUNK_BYTES]
        return chunk[:len(chunk) + answer] if answer < 0 else chunk + b"\0" * answer

    try:
        got = assemble("model.safetensors", size, digest, read_chunk)
    except FetchError:
        event("refused")
        return
    event("assembled")
    assert len(got) == size and hashlib.sha256(got).hexdigest() == digest
    chunks = (size + CHUNK_BYTES - 1) // CHUNK_BYTES
    assert len(reads) <= chunks * CHUNK_TRIES


# ----------------------------------------------------------------------------- writes under a destination


@ON_DISK
@given(LINKS, st.lists(ASKED, min_size=1, max_size=12), st.booleans())
@example({"escape": "outside", "root": "nothing"}, ["escape/victim", "root/etc/passwd"], False)
def test_target_path_refuses_or_resolves_inside_the_destination(links: dict[str, str], names: list[str],
                                                              via_link: bool) -> None:
    with tree(links, with_root=True) as base:
        dest = base / ("dest-link" if via_link else "dest")
        root = Path(os.path.realpath(dest))
        before = snapshot(base)
        for name in names:
            try:
                path = target_path(dest, name)
            except FetchError:
                event("refused")
                continue
            event("accepted")
            assert plain(name)
            assert path.name == name.split("/")[-1] and path.parent.is_relative_to(root), (name, path)
            assert_lands_inside(path, root, name)
        assert snapshot(base) == before, "target_path writes nothing"


@ON_DISK
@given(LINKS, st.lists(st.tuples(ASKED, st.binary(max_size=16)), min_size=1, max_size=10), st.booleans())
@example({"escape": "outside"}, [("escape/victim", b"pwned"), ("escape/new/file", b"")], False)
@example({"up": "..", "inner": "rel-sub"}, [("up/outside/victim", b"x"), ("inner/f", b"in")], True)
@example({"alias": "victim", "sub/back": ".."}, [("alias", b"x"), ("sub/back/summary.json", b"y")], False)
def test_save_writes_inside_the_destination_or_raises_fetch_error(links: dict[str, str],
                                                                  files: list[tuple[str, bytes]],
                                                                  via_link: bool) -> None:
    with tree(links) as base:
        dest = base / ("dest-link" if via_link else "dest")
        root = Path(os.path.realpath(dest))
        outside = outside_of_dest(snapshot(base))
        for name, data in files:
            try:
                path = save(dest, name, data)
            except FetchError:
                event("refused")
                continue
            event("saved")
            assert plain(name)
            assert_lands_inside(path, root, name)
            real = Path(os.path.realpath(path))
            assert not real.is_symlink() and real.read_bytes() == data, name
        assert outside_of_dest(snapshot(base)) == outside, "nothing outside the destination changed"
        assert not [p for p in base.rglob("*.part")], "no temp file is left behind"


@ON_DISK
@given(LINKS, st.lists(ASKED, max_size=5), st.data())
def test_collect_writes_inside_the_destination_or_raises_fetch_error(links: dict[str, str], wanted: list[str],
                                                                     data: st.DataObject) -> None:
    """A listing of names the pod chose (asked for or not, each perhaps twice), sizes and digests true
    or not, garbage lines between, and chunks true, short, long or other."""
    asked = [w for w in wanted if plain(w)]
    honest = bool(asked) and data.draw(st.booleans(), label="honest")  # some of what was asked, truly
    names = st.sampled_from(asked) if honest else \
        st.one_of(st.sampled_from(wanted), NAMES) if wanted else NAMES
    files = data.draw(st.dictionaries(names, st.binary(max_size=40), max_size=5), label="files")
    lies = st.just(0) if honest else st.sampled_from([0, 0, 0, 1, -1])
    lines = []
    for name, content in files.items():
        size = len(content) + data.draw(lies, label="size lie")
        true_digest = honest or data.draw(st.sampled_from([True, True, True, False]), label="true digest")
        digest = hashlib.sha256(content if true_digest else b"x").hexdigest()
        times = 1 if honest else data.draw(st.sampled_from([1, 1, 2]), label="times")
        lines += [f"S {size} {name}", f"{digest}  {name}"] * times
    garbage = st.text(max_size=20) if honest else st.one_of(LISTING_LINES, st.text(max_size=20))
    lines += data.draw(st.lists(garbage, max_size=2), label="garbage")
    order = data.draw(st.permutations(lines), label="order")
    listing = "\n".join(order).encode("utf-8", "surrogatepass")
    cut = data.draw(lies, label="chunk lie")

    def read_chunk(name: str, index: int) -> bytes:
        chunk = files.get(name, b"")[index * CHUNK_BYTES:(index + 1) * CHUNK_BYTES]
        return chunk[:cut] if cut < 0 else chunk + b"y" * cut

    with tree(links) as base:
        dest = base / "dest"
        root = Path(os.path.realpath(dest))
        outside = outside_of_dest(snapshot(base))
        try:
            paths = collect(dest, wanted, listing, read_chunk)
        except FetchError:
            event("refused")
        else:
            event(f"collected {len(paths)}")
            assert len(paths) == len({p for p in paths})
            for path in paths:
                assert_lands_inside(path, root, str(path))
                rel = path.relative_to(dest).as_posix()
                assert rel in wanted and Path(os.path.realpath(path)).read_bytes() == files[rel]
        assert outside_of_dest(snapshot(base)) == outside, "nothing outside the destination changed"
        assert not [p for p in base.rglob("*.part")], "no temp file is left behind"
