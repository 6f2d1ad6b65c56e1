"""The decoded store (``--input-store``, ``pets_training.store``): built once, read instead of decoding, the
same crops as the files give; rebuilt when a file changes, refused with a clear error when corrupt."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from accelerate.data_loader import skip_first_batches

from pets_training import store
from pets_training.config import resolve
from pets_training.data import PetsData, build_data, load_file_fast
from pets_training.device_input import StoreCrops, device_train_loader
from pets_training.inputs import worker_options
from pets_training.store import StoreError, use_store, why_stale
from pets_training.synthetic import write_synthetic

from .helpers import DEVICE_PATH_PROGRESS, assert_crops_close, assert_same_progress, train_variants

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")


def _cfg() -> object:
    return resolve(overrides={"batch_size": 5, "seed": 42})


def _set(tmp_path: Path) -> Path:
    images = tmp_path / "images"
    write_synthetic(images, 3, 6, 40, seed=5)
    return images


def test_the_store_gives_the_files_crops_and_is_reused(tmp_path: Path) -> None:
    images = _set(tmp_path)
    plain = build_data(str(images), 32, 42, 0.8, 0, 0)
    stored = build_data(str(images), 32, 42, 0.8, 0, 0)
    line = use_store(stored, str(tmp_path / "store"))
    assert "building it (there is none yet)" in line
    n = len(plain.train)
    for key in (0, 3, n + 1, 4 * n + 2):  # several epochs: the same seeded crops
        assert torch.equal(stored.train[key][0], plain.train[key][0])
    for i in range(len(plain.eval)):
        assert torch.equal(stored.eval[i][0], plain.eval[i][0])
    # the device path crops the store's decoded images, with no workers: the same boxes, resized together
    loader, sampler, crops = device_train_loader(stored.train, _cfg(), worker_options(0, False), CPU)
    assert isinstance(crops, StoreCrops) and loader.num_workers == 0
    sampler.set_epoch(2)
    keys = list(sampler)
    got = torch.cat([crops(batch)[0] for batch in loader])
    assert_crops_close(got, torch.stack([plain.train[k][0] for k in keys]))
    resumed = torch.cat([crops(batch)[0] for batch in skip_first_batches(loader, 1)])  # a resume at step 1
    assert torch.equal(resumed, got[5:])
    again = build_data(str(images), 32, 42, 0.8, 0, 0)
    assert "reusing it" in use_store(again, str(tmp_path / "store"))


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files the store's build decodes."""
    names: list[str] = []

    def counting(path: Path) -> torch.Tensor:
        names.append(path.name)
        return load_file_fast(path)

    monkeypatch.setattr(store, "load_file_fast", counting)
    return names


def _same_images(data: PetsData, plain: PetsData) -> bool:
    return all(torch.equal(data.train[k][0], plain.train[k][0]) for k in range(len(plain.train))) and \
        all(torch.equal(data.eval[i][0], plain.eval[i][0]) for i in range(len(plain.eval)))


def test_a_changed_or_new_file_updates_the_store_for_it_alone(tmp_path: Path, decoded: list[str]) -> None:
    images = _set(tmp_path)
    use_store(build_data(str(images), 32, 42, 0.8, 0, 0), str(tmp_path / "store"))
    assert len(decoded) == 18
    [directory] = (tmp_path / "store").iterdir()  # one store for the data directory, whatever its files
    write_synthetic(tmp_path / "other", 3, 6, 52, seed=9)  # other pixels, another size
    changed = sorted(images.iterdir())[4]
    new = images / "Abyssinian_99.jpg"
    whys = [(changed, f"{changed} changed since it was built"),
            (new, "the set's files are not the ones it was built from")]
    for step, (path, why) in enumerate(whys):
        path.write_bytes((tmp_path / "other" / changed.name).read_bytes())
        os.utime(path, ns=(1, 1))
        decoded.clear()
        data = build_data(str(images), 32, 42, 0.8, 0, 0)
        line = use_store(data, str(tmp_path / "store"))
        assert decoded == [path.name]
        assert f"updating it ({why}): 1 of {18 + step} images decoded, the others kept" in line
        assert _same_images(data, build_data(str(images), 32, 42, 0.8, 0, 0))
        index = json.loads((directory / "store.json").read_text())
        assert sorted(p.name for p in directory.glob("images-*.u8")) == sorted(index["data"])
        assert len(index["data"]) == 2 + step and index["bytes"][-1] == 3 * 52 * 52  # the one decoded
    decoded.clear()
    assert "reusing it" in use_store(build_data(str(images), 32, 42, 0.8, 0, 0), str(tmp_path / "store"))
    assert decoded == []


def test_an_update_past_the_data_files_limit_copies_the_store_into_one(tmp_path: Path,
                                                                       decoded: list[str]) -> None:
    images = _set(tmp_path)
    use_store(build_data(str(images), 32, 42, 0.8, 0, 0), str(tmp_path / "store"))
    [directory] = (tmp_path / "store").iterdir()
    for step in range(store.MAX_DATA_FILES):
        os.utime(sorted(images.iterdir())[step], ns=(1, 1))
        decoded.clear()
        data = build_data(str(images), 32, 42, 0.8, 0, 0)
        line = use_store(data, str(tmp_path / "store"))
        assert len(decoded) == 1
        assert _same_images(data, build_data(str(images), 32, 42, 0.8, 0, 0))
    assert "1 of 18 images decoded, the others copied into one data file (17)" in line
    assert len(list(directory.glob("images-*.u8"))) == 1


def test_a_corrupt_store_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    images = _set(tmp_path)
    store = tmp_path / "store"
    data = build_data(str(images), 32, 42, 0.8, 0, 0)
    use_store(data, str(store))
    [directory] = store.iterdir()
    index = json.loads((directory / "store.json").read_text())
    blob = directory / index["data"][0]
    raw = bytearray(blob.read_bytes())
    raw[index["offsets"][2] + 7] ^= 0xFF  # one byte of image 2
    blob.write_bytes(bytes(raw))
    again = build_data(str(images), 32, 42, 0.8, 0, 0)
    use_store(again, str(store))  # the index still matches the files: the store is read
    with pytest.raises(StoreError, match=r"is corrupt: image 2 does not match its checksum; delete"):
        for images_set in (again.train, again.eval):
            for i in range(len(images_set)):
                images_set[i]
    blob.write_bytes(bytes(raw[:-10]))  # truncated
    paths = data.train.files()
    assert paths is not None
    with pytest.raises(StoreError, match=r"is corrupt: its data file .* holds \d+ bytes, its index says"):
        use_store(build_data(str(images), 32, 42, 0.8, 0, 0), str(store))
    (directory / "store.json").write_text("{not json")
    with pytest.raises(StoreError, match="its index store.json cannot be read"):
        why_stale(directory, paths)


@pytest.mark.timeout(300)
def test_the_trainer_learns_the_same_from_the_store(tmp_path: Path) -> None:
    """Both input paths read the store; epoch for epoch the same loss and accuracy as from the files (the
    device path: within its crops' tolerance)."""
    store = ["--input-store", str(tmp_path / "store")]
    logs = train_variants(tmp_path, {"files": [], "store-cpu": store,
                                     "store-device": [*store, "--input-path", "device"]})
    assert "building it (there is none yet)" in logs["store-cpu"] and "reusing it" in logs["store-device"]
    assert_same_progress(tmp_path / "files", tmp_path / "store-cpu")
    assert_same_progress(tmp_path / "files", tmp_path / "store-device", **DEVICE_PATH_PROGRESS)
