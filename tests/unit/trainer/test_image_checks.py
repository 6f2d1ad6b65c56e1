"""The index of image checks (``pets_training.image_checks``): a run over unchanged files opens none of them,
a new or changed file is opened alone, a corrupt one is reported every run, and what the run makes of the
data is the same with the index as without it. A bad index is ignored and rebuilt; only a writer writes."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from pets_training.data import PetsData, build_data, write_report
from pets_training.image_checks import INDEX_VERSION, index_path
from pets_training.synthetic import write_synthetic

pytestmark = pytest.mark.unit


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the files PIL opens (building the data decodes nothing else: loading is lazy)."""
    names: list[str] = []
    real = Image.open

    def counting(fp: Any, *args: Any, **kw: Any) -> Image.Image:
        names.append(Path(fp).name)
        return real(fp, *args, **kw)

    monkeypatch.setattr(Image, "open", counting)
    yield names


def _images(tmp_path: Path) -> Path:
    images = tmp_path / "images"
    write_synthetic(images, 3, 6, 40, seed=5)
    return images


def _build(images: Path, index: Path | None, write: bool = True) -> PetsData:
    return build_data(str(images), 32, 42, 0.8, 0, 0, check_index_dir=index, write_check_index=write)


def _same(a: PetsData, b: PetsData) -> bool:
    """The same classes, split, labels and crops (two epochs of training keys, every eval image)."""
    if (a.classes, a.train.labels, a.eval.labels, a.train.files(), a.eval.files(), a.report) != \
            (b.classes, b.train.labels, b.eval.labels, b.train.files(), b.eval.files(), b.report):
        return False
    n = len(a.train)
    return all(torch.equal(a.train[k][0], b.train[k][0]) for k in (0, 5, n + 5, 2 * n - 1)) and \
        all(torch.equal(a.eval[i][0], b.eval[i][0]) for i in range(len(a.eval)))


def test_an_unchanged_folder_is_not_opened_again(tmp_path: Path, opened: list[str]) -> None:
    images = _images(tmp_path)
    plain = _build(images, None)
    assert len(opened) == 18
    opened.clear()
    first = _build(images, tmp_path / "out")
    assert len(opened) == 18  # no index yet: every file, once
    opened.clear()
    second = _build(images, tmp_path / "out")
    assert opened == []
    assert _same(plain, first) and _same(plain, second)
    [index] = (tmp_path / "out").iterdir()  # one file, no temp left behind
    assert index == index_path(tmp_path / "out", images)
    entry = json.loads(index.read_text())["files"]["Abyssinian_0.jpg"]
    assert entry["width"] == entry["height"] == 40
    assert entry["size"] == (images / "Abyssinian_0.jpg").stat().st_size


def test_a_changed_or_new_file_is_checked_alone(tmp_path: Path, opened: list[str]) -> None:
    images = _images(tmp_path)
    _build(images, tmp_path / "out")
    changed = sorted(images.iterdir())[4]
    write_synthetic(tmp_path / "other", 3, 6, 52, seed=9)  # other pixels, another size
    changed.write_bytes((tmp_path / "other" / changed.name).read_bytes())
    os.utime(changed, ns=(1, 1))
    opened.clear()
    data = _build(images, tmp_path / "out")
    assert opened == [changed.name]
    assert _same(data, _build(images, None))
    new = images / "Abyssinian_99.jpg"
    new.write_bytes((tmp_path / "other" / "Abyssinian_0.jpg").read_bytes())
    opened.clear()
    data = _build(images, tmp_path / "out")
    assert opened == [new.name] and len(data.train) + len(data.eval) == 19
    opened.clear()
    _build(images, tmp_path / "out")
    assert opened == []
    new.unlink()  # a file gone is dropped from the index, nothing opened
    opened.clear()
    data = _build(images, tmp_path / "out")
    assert opened == [] and len(data.train) + len(data.eval) == 18
    assert "Abyssinian_99.jpg" not in json.loads(index_path(tmp_path / "out", images).read_text())["files"]


def test_a_corrupt_file_is_reported_on_every_run(
    tmp_path: Path, opened: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    images = _images(tmp_path)
    bad = sorted(images.iterdir())[3]
    bad.write_bytes(bad.read_bytes()[:200])  # truncated
    reports = []
    for run in range(2):
        opened.clear()
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            data = _build(images, tmp_path / "out")
        assert len(opened) == (18 if run == 0 else 0)
        assert [p.name for p, _ in data.skipped] == [bad.name]
        assert f"skipped 1 unreadable image(s) of 18 in {images}: {bad.name}: " in caplog.text
        report = json.loads(write_report(data.report, tmp_path / f"run{run}").read_text())
        assert report["skipped_files"][0]["file"] == bad.name
        assert report["skipped_files"][0]["reason"].startswith("unreadable (")
        reports.append(report)
    assert reports[0] == reports[1]
    assert _same(data, _build(images, None))


@pytest.mark.parametrize("damage", ["not json", "truncated", "another version", "another root", "a bad entry",
                                    "an entry that lies about its kind"])
def test_a_bad_index_is_ignored_and_rebuilt(tmp_path: Path, opened: list[str], damage: str) -> None:
    images = _images(tmp_path)
    _build(images, tmp_path / "out")
    path = index_path(tmp_path / "out", images)
    text = path.read_text()
    index = json.loads(text)
    first = next(iter(index["files"]))
    if damage == "not json":
        path.write_text("{not json")
    elif damage == "truncated":
        path.write_text(text[: len(text) // 2])
    elif damage == "another version":
        path.write_text(json.dumps({**index, "version": INDEX_VERSION + 1}))
    elif damage == "another root":
        path.write_text(json.dumps({**index, "root": str(tmp_path / "elsewhere")}))
    elif damage == "a bad entry":
        index["files"][first]["size"] = str(index["files"][first]["size"])
        path.write_text(json.dumps(index))
    else:
        index["files"][first]["error"] = "made up"  # both an image and an error: not ours
        path.write_text(json.dumps(index))
    opened.clear()
    data = _build(images, tmp_path / "out")
    assert len(opened) == 18 and data.skipped == []
    assert json.loads(path.read_text())["files"] == json.loads(text)["files"]  # rebuilt
    opened.clear()
    _build(images, tmp_path / "out")
    assert opened == []


def test_only_the_writer_writes_the_index(tmp_path: Path, opened: list[str]) -> None:
    images = _images(tmp_path)
    _build(images, tmp_path / "out", write=False)  # a local rank other than the main one, first
    assert not (tmp_path / "out").exists()
    _build(images, tmp_path / "out")  # the local main process
    path = index_path(tmp_path / "out", images)
    before = path.read_text()
    changed = sorted(images.iterdir())[0]
    os.utime(changed, ns=(2, 2))
    opened.clear()
    _build(images, tmp_path / "out", write=False)  # reads the index, checks what changed, writes nothing
    assert opened == [changed.name] and path.read_text() == before


def test_an_index_that_cannot_be_written_does_not_fail_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    images = _images(tmp_path)
    (tmp_path / "file").write_text("x")
    with caplog.at_level(logging.WARNING):
        data = _build(images, tmp_path / "file" / "out")  # a directory under a file: mkdir fails
    assert len(data.train) + len(data.eval) == 18
    assert "could not be written" in caplog.text and "the next run checks again" in caplog.text
