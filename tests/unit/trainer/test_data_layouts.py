"""Layout detection, the image kinds people have, and the dataset report, on small made-up trees."""

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pets_training.data import (
    DataError,
    build_data,
    dataset_report,
    detect_layout,
    list_samples,
    report_counts,
    write_report,
)

pytestmark = pytest.mark.unit


def _image(path: Path, mode: str = "RGB", seed: int = 0) -> Path:
    """A small real image file of the given PIL mode, in the format its suffix names."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = (np.random.default_rng(seed).random((24, 30, 3)) * 255).astype("uint8")
    Image.fromarray(pixels).convert(mode).save(path)
    return path


def _build(path: Path, layout: str = "auto") -> object:
    return build_data(str(path), image_size=16, seed=42, train_fraction=0.8, synthetic_classes=2,
                      synthetic_images_per_class=2, layout=layout)


def test_a_flat_folder_of_label_names_is_the_tutorials_layout(tmp_path: Path) -> None:
    for n in range(3):
        _image(tmp_path / f"beagle_{n}.jpg")
        _image(tmp_path / f"Persian_{n}.png")
    listing = list_samples(tmp_path)
    assert listing.layout == "flat" and listing.root == tmp_path
    assert sorted({label for _, label in listing.samples}) == ["Persian", "beagle"]
    assert len(listing.samples) == 6 and listing.skipped == []


def test_the_oxford_archive_layout_skips_its_mat_files(tmp_path: Path) -> None:
    images = tmp_path / "images"
    for n in range(2):
        _image(images / f"Abyssinian_{n}.jpg")
        _image(images / f"great_pyrenees_{n}.jpg")
    (images / "Abyssinian_100.mat").write_bytes(b"MATLAB 5.0")
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations" / "list.txt").write_text("# not images\n")
    assert detect_layout(tmp_path) == "oxford"
    listing = list_samples(tmp_path)
    assert listing.root == images
    assert [(p.name, label) for p, label in listing.samples][:2] == [
        ("Abyssinian_0.jpg", "Abyssinian"), ("Abyssinian_1.jpg", "Abyssinian")]
    assert [(p.name, why) for p, why in listing.skipped] == [
        ("Abyssinian_100.mat", "not an image (suffix '.mat')")]


def test_a_folder_per_class_is_imagefolder(tmp_path: Path) -> None:
    _image(tmp_path / "cats" / "001.png")
    _image(tmp_path / "cats" / "nested" / "002.jpeg")
    _image(tmp_path / "dogs" / "a.JPG")
    (tmp_path / "README.txt").write_text("about the set")
    _image(tmp_path / "__MACOSX" / "cats" / "._001.png")
    assert detect_layout(tmp_path) == "imagefolder"
    listing = list_samples(tmp_path)
    assert [(str(p.relative_to(tmp_path)), label) for p, label in listing.samples] == [
        ("cats/001.png", "cats"), ("cats/nested/002.jpeg", "cats"), ("dogs/a.JPG", "dogs")]
    assert sorted((str(p.relative_to(tmp_path)), why) for p, why in listing.skipped) == [
        ("README.txt", "not an image (suffix '.txt')"),
        ("__MACOSX/cats/._001.png", "hidden file or archive metadata"),
    ]


def test_a_forced_layout_wins_over_detection(tmp_path: Path) -> None:
    _image(tmp_path / "cats" / "cat_1.jpg")
    _image(tmp_path / "dogs" / "dog_1.jpg")
    assert list_samples(tmp_path).layout == "imagefolder"
    with pytest.raises(DataError, match=r"no image in '.*' follows the flat layout .*spec.dataset.layout"):
        list_samples(tmp_path, "flat")  # the flat rule reads no sub-folders
    with pytest.raises(DataError, match=r"layout 'folders' is not one of auto, flat, oxford, imagefolder"):
        list_samples(tmp_path, "folders")


def test_images_of_every_mode_train_as_rgb_and_a_corrupt_one_is_reported(tmp_path: Path) -> None:
    """Grayscale, CMYK and RGBA files (the Pets archive has each) become 3-channel images; a file that
    does not decode is counted, named and skipped."""
    for n, mode in enumerate(["L", "CMYK", "RGB", "RGB", "RGB"]):
        _image(tmp_path / "cat" / f"{n}.jpg", mode, seed=n)
    for n, mode in enumerate(["RGBA", "P", "L", "RGB", "RGB"]):
        _image(tmp_path / "dog" / f"{n}.png", mode, seed=10 + n)
    (tmp_path / "dog" / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    data = _build(tmp_path)
    images = [data.train[i][0] for i in range(len(data.train))]  # type: ignore[attr-defined]
    images += [data.eval[i][0] for i in range(len(data.eval))]  # type: ignore[attr-defined]
    assert len(images) == 10 and all(tuple(img.shape) == (3, 16, 16) for img in images)
    report = data.report  # type: ignore[attr-defined]
    assert report["layout"] == "imagefolder" and report["per_class"] == {"cat": 5, "dog": 5}
    assert report["images"] == 10 and report["classes"] == 2
    assert report["train_images"] + report["eval_images"] == 10 and report["eval_images"] == 2
    assert report["skipped"] == 1 and report["skipped_by_reason"] == {"unreadable": 1}
    assert report["skipped_files"][0]["file"] == "dog/broken.jpg"
    assert report["skipped_files"][0]["reason"].startswith("unreadable (")


def test_the_report_counts_reasons_keeps_whole_counts_and_round_trips(tmp_path: Path) -> None:
    skipped = [(f"x{n}.mat", "not an image (suffix '.mat')") for n in range(1200)] + [
        ("bad.jpg", "unreadable (OSError: truncated)")]
    report = dataset_report("oxford", "/data/images", ["a", "b", "a"], skipped, 2, 1)
    assert report["skipped"] == 1201 and len(report["skipped_files"]) == 1000
    assert report["skipped_by_reason"] == {"not an image": 1200, "unreadable": 1}
    assert report["per_class"] == {"a": 2, "b": 1} and report["classes"] == 2
    assert report_counts(report) == {"layout": "oxford", "images": 3, "classes": 2, "skipped": 1201,
                                     "train_images": 2, "eval_images": 1}
    path = write_report(report, tmp_path / "out")
    assert path.name == "dataset.json" and json.loads(path.read_text()) == report
    assert [p.name for p in path.parent.iterdir()] == ["dataset.json"]  # no temp file left


def test_the_synthetic_set_reports_too() -> None:
    data = _build(Path("synthetic"))
    assert report_counts(data.report) == {  # type: ignore[attr-defined]
        "layout": "synthetic", "images": 4, "classes": 2, "skipped": 0, "train_images": 3, "eval_images": 1}
