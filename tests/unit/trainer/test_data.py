import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from pets_training.cli import main as cli_main
from pets_training.data import (
    DataError,
    EpochShuffleSampler,
    build_data,
    extract_label,
    list_image_files,
    split_indices,
)
from pets_training.synthetic import synthetic_image, write_synthetic

pytestmark = pytest.mark.unit


def _build(path: Path | str, **kw: object) -> object:
    args = {
        "image_size": 32,
        "seed": 42,
        "train_fraction": 0.8,
        "synthetic_classes": 3,
        "synthetic_images_per_class": 5,
    }
    args.update(kw)
    return build_data(str(path), **args)  # type: ignore[arg-type]


def test_labels_come_from_file_names() -> None:
    assert extract_label("beagle_32.jpg") == "beagle"
    assert extract_label("great_pyrenees_7.jpg") == "great_pyrenees"
    assert extract_label("Abyssinian_100.jpg") == "Abyssinian"
    assert extract_label("beagle_1.png") == "beagle" and extract_label("Pug_3.JPEG") == "Pug"
    assert extract_label("beagle.jpg") is None and extract_label("beagle_1.gif") is None


def test_split_is_seeded_and_disjoint() -> None:
    train, evals = split_indices(100, 42, 0.8)
    assert (len(train), len(evals)) == (80, 20)
    assert sorted(train + evals) == list(range(100))
    assert split_indices(100, 42, 0.8) == (train, evals)
    assert split_indices(100, 43, 0.8) != (train, evals)


def test_synthetic_images_are_deterministic_and_class_specific() -> None:
    a = synthetic_image(42, 3, 1, 4, 48)
    assert a.shape == (48, 48, 3) and a.dtype == np.uint8
    assert np.array_equal(a, synthetic_image(42, 3, 1, 4, 48))
    assert not np.array_equal(a, synthetic_image(42, 4, 1, 4, 48))
    # the class colour differs: mean hue of class 0 vs class 2 images
    c0 = np.mean([synthetic_image(42, i, 0, 4, 48).reshape(-1, 3).mean(0) for i in range(8)], axis=0)
    c2 = np.mean([synthetic_image(42, i, 2, 4, 48).reshape(-1, 3).mean(0) for i in range(8)], axis=0)
    assert np.abs(c0 - c2).max() > 20


def test_make_synthetic_writes_the_file_name_convention(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pets"
    assert cli_main(["make-synthetic", str(out), "--classes", "3", "--per-class", "4", "--size", "40"]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert len(names) == 12 and "Abyssinian_0.jpg" in names and "american_bulldog_3.jpg" in names
    assert "wrote 12 images" in capsys.readouterr().out
    data = _build(out)
    assert data.classes == ["Abyssinian", "american_bulldog", "american_pit_bull_terrier"]  # type: ignore[attr-defined]
    image, label = data.train[0]  # type: ignore[attr-defined]
    assert image.shape == (3, 32, 32) and image.dtype == torch.uint8 and 0 <= label < 3


def test_fast_and_pil_decoding_agree(tmp_path: Path) -> None:
    write_synthetic(tmp_path, 2, 3, 40, 42)
    fast = _build(tmp_path, fast_decode=True)
    pil = _build(tmp_path, fast_decode=False)
    a, b = fast.eval[0][0].float(), pil.eval[0][0].float()  # type: ignore[attr-defined]
    assert (a - b).abs().mean() < 2.0  # same libjpeg-turbo decode; at most rounding differences


def test_missing_empty_and_unmatched_directories_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"data: directory '.*nope' does not exist"):
        list_image_files(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"data: directory '.*empty' is empty"):
        list_image_files(tmp_path / "empty")
    other = tmp_path / "other"
    other.mkdir()
    (other / "cat.png").write_bytes(b"x")
    with pytest.raises(DataError, match=r"no image in '.*other' follows the flat layout .*cat.png"):
        list_image_files(other)
    file = tmp_path / "file.txt"
    file.write_text("x")
    with pytest.raises(DataError, match="is not a directory"):
        list_image_files(file)


def test_a_single_class_fails_clearly(tmp_path: Path) -> None:
    write_synthetic(tmp_path, 2, 3, 32, 42)
    for p in tmp_path.glob("american_bulldog_*.jpg"):
        p.unlink()
    with pytest.raises(DataError, match=r"holds only one class \('Abyssinian'\)"):
        _build(tmp_path)


def test_corrupt_images_are_skipped_counted_and_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_synthetic(tmp_path, 2, 5, 32, 42)
    (tmp_path / "beagle_1.jpg").write_bytes(b"not a jpeg at all")
    whole = (tmp_path / "Abyssinian_0.jpg").read_bytes()
    (tmp_path / "Abyssinian_0.jpg").write_bytes(whole[: len(whole) // 2])  # truncated
    with caplog.at_level(logging.WARNING):
        data = _build(tmp_path)
    assert len(data.train) + len(data.eval) == 9  # type: ignore[attr-defined]
    assert [p.name for p, _ in data.skipped] == ["Abyssinian_0.jpg", "beagle_1.jpg"]  # type: ignore[attr-defined]
    assert "skipped 2 unreadable image(s) of 11" in caplog.text and "beagle_1.jpg" in caplog.text


def test_all_corrupt_fails_clearly(tmp_path: Path) -> None:
    for name in ("a_1.jpg", "b_1.jpg"):
        (tmp_path / name).write_bytes(b"junk")
    with pytest.raises(DataError, match=r"none of the images in '.*' could be read \(2 corrupt\)"):
        _build(tmp_path)


def test_shuffle_and_augmentation_depend_only_on_seed_epoch_and_index() -> None:
    data = _build("synthetic", synthetic_images_per_class=8)
    sampler = EpochShuffleSampler(len(data.train), 42)  # type: ignore[attr-defined]
    epoch0 = list(sampler)
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    n = len(data.train)  # type: ignore[attr-defined]
    assert sorted(epoch0) == list(range(n)) and sorted(epoch1) == list(range(n, 2 * n)) and epoch0 != epoch1

    def batches(workers: int) -> list[torch.Tensor]:
        sampler.set_epoch(1)
        loader = DataLoader(data.train, batch_size=4, sampler=sampler, num_workers=workers)  # type: ignore[arg-type]
        return [images for images, _ in loader]

    torch.manual_seed(0)
    a = batches(0)
    torch.manual_seed(123)  # the global RNG does not matter
    b = batches(2)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    # and epochs differ in their crops of the same image
    first, _ = data.train[0]  # type: ignore[attr-defined]
    again, _ = data.train[n]  # type: ignore[attr-defined]
    assert not torch.equal(first, again)


def test_too_small_a_set_to_split_fails_clearly() -> None:
    with pytest.raises(DataError, match="evaluation set would be empty"):
        _build("synthetic", synthetic_classes=2, synthetic_images_per_class=1, train_fraction=0.4)


def test_image_fixture_sanity(tmp_path: Path) -> None:
    write_synthetic(tmp_path, 2, 1, 24, 42)
    with Image.open(tmp_path / "Abyssinian_0.jpg") as img:
        assert img.size == (24, 24) and img.mode == "RGB"
