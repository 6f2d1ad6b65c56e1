"""The training crop taken a whole batch at once (``pets_training.crops``, issue 55, section 1): boxes as a
function of (seed, epoch, index) alone, one batched resize within a stated tolerance of torchvision's, and,
on the device input path, a batch built by as many operations at 32, 64 and 128 images (no per-image call
on the training thread; its host time per batch is `make bench`'s to measure, not a timed assertion's)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from pets_training import device_input
from pets_training.crops import crop_boxes, resize_boxes
from pets_training.data import PetsData, build_data
from pets_training.device_input import DeviceCrops, EncodedImages, StoreCrops, collate_encoded
from pets_training.store import use_store
from pets_training.synthetic import write_synthetic

from .helpers import assert_crops_close

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")
BATCHES = (32, 64, 128)


def _boxes(seed: int, epoch: int, index: torch.Tensor, height: int, width: int) -> torch.Tensor:
    n = len(index)
    return crop_boxes(seed, torch.full((n,), epoch), index, torch.full((n,), height), torch.full((n,), width))


def test_a_box_is_a_function_of_seed_epoch_and_index_whatever_the_batch() -> None:
    index = torch.arange(300)
    heights, widths = 40 + index % 97, 30 + (7 * index) % 113
    epochs = torch.full((300,), 4)
    boxes = crop_boxes(42, epochs, index, heights, widths)
    alone = torch.cat([crop_boxes(42, epochs[k:k + 1], index[k:k + 1], heights[k:k + 1], widths[k:k + 1])
                       for k in range(300)])
    assert torch.equal(boxes, alone)  # bit for bit, alone or vectorised
    order = torch.randperm(300, generator=torch.Generator().manual_seed(0))
    assert torch.equal(crop_boxes(42, epochs[order], index[order], heights[order], widths[order]),
                       boxes[order])
    top, left, h, w = boxes.unbind(1)
    assert bool(((top >= 0) & (left >= 0) & (h > 0) & (w > 0)).all())
    assert bool(((top + h <= heights) & (left + w <= widths)).all())
    assert not torch.equal(crop_boxes(42, epochs + 1, index, heights, widths), boxes)
    assert not torch.equal(crop_boxes(43, epochs, index, heights, widths), boxes)


def test_the_boxes_follow_random_resized_crops_distribution() -> None:
    """Over 20,000 boxes of a 500x375 image: area and aspect ratio as torchvision's RandomResizedCrop draws
    them (its means, measured here: area 0.663 of the image, log ratio 0.080)."""
    ours = _boxes(7, 0, torch.arange(20_000), 375, 500).double()
    tv = v2.RandomResizedCrop(224, scale=(0.5, 1.0))
    torch.manual_seed(0)
    image = torch.zeros(3, 375, 500, dtype=torch.uint8)
    theirs = torch.tensor([[p["top"], p["left"], p["height"], p["width"]]
                           for p in (tv.make_params([image]) for _ in range(5_000))]).double()
    for boxes in (ours, theirs):
        area = boxes[:, 2] * boxes[:, 3] / (375 * 500)
        ratio = (boxes[:, 3] / boxes[:, 2]).log()
        assert area.min() >= 0.49 and area.max() <= 1.0 and ratio.abs().max() <= 0.29
        assert abs(float(area.mean()) - 0.663) < 0.01 and abs(float(ratio.mean()) - 0.080) < 0.01


def _images(sizes: list[tuple[int, int]]) -> list[torch.Tensor]:
    """Smooth images with noise, as photos are: each of its own size."""
    generator = torch.Generator().manual_seed(1)
    out = []
    for height, width in sizes:
        smooth = torch.nn.functional.interpolate(torch.rand(1, 3, 6, 5, generator=generator),
                                                 size=(height, width), mode="bicubic")[0]
        out.append((smooth * 200 + torch.rand(3, height, width, generator=generator) * 55)
                   .clamp(0, 255).to(torch.uint8))
    return out


def _flat(images: list[torch.Tensor], room: int) -> tuple[torch.Tensor, torch.Tensor]:
    sizes = torch.tensor([image.numel() for image in images])
    shapes = torch.tensor([image.shape[1:] for image in images])
    layout = torch.cat([(sizes.cumsum(0) - sizes)[:, None], shapes], dim=1)
    return torch.cat([image.flatten() for image in images] + [torch.zeros(room, dtype=torch.uint8)]), layout


@pytest.mark.parametrize("size", [24, 48, 96])
def test_one_batched_resize_is_torchvisions_within_the_tolerance(size: int) -> None:
    """Boxes that shrink and boxes that grow, in images of 40 sizes, against torchvision's resized_crop of
    each (the CPU path's): helpers.CROP_MAX_LEVELS and CROP_MEAN_LEVELS."""
    sizes = [(30 + 7 * k % 90, 25 + 11 * k % 100) for k in range(40)]
    images = _images(sizes)
    heights, widths = torch.tensor(sizes).unbind(1)
    boxes = crop_boxes(3, torch.zeros(40, dtype=torch.long), torch.arange(40), heights, widths)
    flat, layout = _flat(images, 128)
    box_max = tuple(boxes[:, 2:].amax(0).tolist())
    got = resize_boxes(flat, layout, boxes, size, box_max)  # type: ignore[arg-type]
    expected = torch.stack([TF.resized_crop(image, *box, [size, size], antialias=True)
                            for image, box in zip(images, boxes.tolist(), strict=True)])
    assert_crops_close(got, expected)


# ------------------------------------------------------------------ the training thread's work per batch


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """160 small JPEGs of two sizes: on the CPU backend the crops' arithmetic is then a small part of
    building a batch, as on a GPU, where it is not the host's."""
    directory = tmp_path_factory.mktemp("tiny")
    write_synthetic(directory / "images", 4, 20, 20, seed=1)
    write_synthetic(directory / "other", 4, 20, 27, seed=2)
    for path in (directory / "other").iterdir():
        label, n = path.stem.rsplit("_", 1)
        path.rename(directory / "images" / f"{label}_{100 + int(n)}.jpg")
    return directory / "images"


def _data(images: Path) -> PetsData:
    return build_data(str(images), 8, 42, 0.9, 0, 0)  # 144 for training


class CountOps(TorchDispatchMode):
    """The aten operations dispatched while it is on, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _store_crops(images: Path, store: Path) -> StoreCrops:
    data = _data(images)
    use_store(data, str(store))
    crops = StoreCrops(data.train, CPU)
    crops(torch.arange(len(data.train)))  # every image read once: from now on, a batch only crops
    return crops


def _device_crops(images: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[DeviceCrops, dict[int, Any]]:
    """The nvJPEG path with the decode of a GPU: one call for the batch (the CPU backend's decode_jpeg
    decodes a list one by one; here its images are decoded before)."""
    data = _data(images)
    paths = data.train.files()
    assert paths is not None
    encoded = EncodedImages(paths, data.train.labels)
    batches = {b: collate_encoded([encoded[k % len(paths)] for k in range(b)]) for b in BATCHES}
    decoded = {id(p): decode_jpeg(p, mode=ImageReadMode.RGB) for b in batches.values() for p in b.payloads}
    monkeypatch.setattr(device_input, "decode_jpeg",
                        lambda jpegs, **_: [decoded[id(jpeg)] for jpeg in jpegs])
    crops = DeviceCrops(data.train, paths, CPU)
    crops(batches[128])  # its room past the last image allocated once
    return crops, batches


def test_a_batch_is_as_many_ops_at_32_64_and_128_images(tiny: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every aten operation the training thread dispatches to build one batch, on the store path and the
    nvJPEG path (its decode one call, as on a GPU): the same count whatever the batch size."""
    store = _store_crops(tiny, tmp_path / "store")
    device, batches = _device_crops(tiny, monkeypatch)
    n = len(store.images)
    counts: dict[str, list[int]] = {"store": [], "device": []}
    for b in BATCHES:
        for name, make, batch in (("store", store, torch.arange(n, n + b)), ("device", device, batches[b])):
            with CountOps() as count:
                images, labels = make(batch)
            assert images.shape == (b, 3, 8, 8) and labels.shape == (b,)
            counts[name].append(sum(count.ops.values()))
    assert counts["store"] == [counts["store"][0]] * 3, counts
    assert counts["device"] == [counts["device"][0]] * 3, counts
