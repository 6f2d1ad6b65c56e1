"""Data: labels from file names, the seeded split, the synthetic pets set, datasets and transforms.

Corrupt-image policy: every image file is checked (a cheap reduced-size decode with PIL) once, and again
only when it changes: an index of the checks, in a directory the caller gives, spares a run the files it
holds unchanged (image_checks.py). Unreadable or corrupt files are skipped and counted, with one warning
that names them; every rank reaches the same verdict because the check is deterministic. If no readable
image remains, or fewer than two classes, the run fails with an error naming the directory. A file that
passes the check but still fails to decode later (changed on disk mid-run) stops the run with an error
naming the file.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, Sampler
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms.functional import pil_to_tensor
from torchvision.transforms.v2 import functional as TF

from pets_contract.gauges import DATASET_COUNTS
from pets_contract.names import DATASET_REPORT_FILE

from .contract import PermanentError
from .crops import crop_boxes
from .image_checks import check_images
from .position import MicroStep
from .synthetic import synthetic_class_names, synthetic_image, synthetic_samples

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")  # compared lower-case: .JPG counts
LABEL_PATTERN = re.compile(r"^(.*)_\d+\.(?:jpe?g|png)$", re.IGNORECASE)
SYNTHETIC = "synthetic"
# The dataset directory layouts (detect_layout), and "synthetic" for the built-in set in the report.
LAYOUTS = ("flat", "oxford", "imagefolder")

class DataError(PermanentError):
    """Bad input data (no restart fixes it); the message names the problem and the path."""


class CorruptImageError(RuntimeError):
    """An image that passed the scan at the start failed to decode during training: more likely a read
    error of the volume than a bad file, so not permanent (a restart may help)."""


def extract_label(file_name: str) -> str | None:
    """``beagle_32.jpg`` -> ``beagle`` (also ``.jpeg``, ``.png``, any case); None when the name does not
    follow ``<label>_<n>.<image suffix>``."""
    match = LABEL_PATTERN.match(file_name)
    return match.group(1) if match else None


def is_image_name(name: str) -> bool:
    return Path(name).suffix.lower() in IMAGE_SUFFIXES


def _check_directory(directory: Path) -> None:
    if not directory.exists():
        raise DataError(f"data: directory {str(directory)!r} does not exist")
    if not directory.is_dir():
        raise DataError(f"data: {str(directory)!r} is not a directory")


def _files(directory: Path) -> list[Path]:
    """Regular files under a directory, recursively, in one sorted order on every rank and machine."""
    return sorted(p for p in directory.rglob("*") if p.is_file())


def detect_layout(directory: Path) -> str:
    """Which of the layouts people have a dataset directory follows (``LAYOUTS``):

    - ``oxford``: the Oxford-IIIT Pet archive as unpacked, an ``images/`` folder of ``<Breed>_<n>.jpg``
      next to ``annotations/``, with no images of its own at the top;
    - ``imagefolder``: torchvision's ImageFolder, a folder per class and no images at the top;
    - ``flat``: the tutorial's ``<label>_<n>.jpg`` files in one folder (also the answer for anything else,
      so its error message says what was expected).
    """
    _check_directory(directory)
    if any(p.is_file() and is_image_name(p.name) for p in directory.iterdir()):
        return "flat"
    if (directory / "images").is_dir():
        return "oxford"
    if any(p.is_dir() and any(is_image_name(f.name) for f in _files(p)) for p in directory.iterdir()):
        return "imagefolder"
    return "flat"


@dataclass
class Listing:
    """What a dataset directory holds: the image files with their labels, and the files left out with why."""

    layout: str
    root: Path  # the directory the image paths are relative to (``images/`` of the Oxford layout)
    samples: list[tuple[Path, str]]
    skipped: list[tuple[Path, str]]


def list_samples(directory: Path, layout: str = "auto") -> Listing:
    """The labelled image files of a dataset directory in the given layout (``auto``: detected). Files that
    are not images, or not labelled by the layout's rule, are skipped with the reason; no image at all is
    a DataError naming the directory and the rule."""
    if layout not in ("auto", *LAYOUTS):
        raise DataError(f"data: layout {layout!r} is not one of auto, {', '.join(LAYOUTS)}")
    _check_directory(directory)
    chosen = detect_layout(directory) if layout == "auto" else layout
    root = directory / "images" if chosen == "oxford" else directory
    _check_directory(root)
    files = _files(root) if chosen == "imagefolder" else sorted(p for p in root.iterdir() if p.is_file())
    if not files and not any(root.iterdir()):
        raise DataError(f"data: directory {str(root)!r} is empty")
    samples: list[tuple[Path, str]] = []
    skipped: list[tuple[Path, str]] = []
    for path in files:
        relative = path.relative_to(root)
        if any(part.startswith(".") or part == "__MACOSX" for part in relative.parts):
            skipped.append((path, "hidden file or archive metadata"))
        elif not is_image_name(path.name):
            skipped.append((path, f"not an image (suffix {path.suffix or 'none'!r})"))
        elif chosen == "imagefolder":
            if len(relative.parts) < 2:
                skipped.append((path, "not in a class folder"))
            else:
                samples.append((path, relative.parts[0]))
        elif (label := extract_label(path.name)) is None:
            skipped.append((path, "name does not follow <label>_<n>.jpg"))
        else:
            samples.append((path, label))
    if not samples:
        rule = "a folder per class" if chosen == "imagefolder" else \
            f"<label>_<n>.jpg (regex {LABEL_PATTERN.pattern})"
        examples = ", ".join(str(p.relative_to(root)) for p in (files or sorted(root.iterdir()))[:3])
        raise DataError(
            f"data: no image in {str(root)!r} follows the {chosen} layout ({rule}); found for example: "
            f"{examples}. Set the layout (spec.dataset.layout, --data-layout) if it was detected wrongly"
        )
    return Listing(chosen, root, samples, skipped)


def list_image_files(directory: Path) -> list[Path]:
    """The ``<label>_<n>.jpg`` files of a flat directory, sorted so every rank and machine sees one order."""
    return [path for path, _label in list_samples(directory, "flat").samples]


def label_ids(labels: Sequence[str], where: str) -> dict[str, int]:
    classes = sorted(set(labels))
    if len(classes) < 2:
        only = classes[0] if classes else "none"
        raise DataError(f"data: {where} holds only one class ({only!r}); a classifier needs at least 2")
    return {label: i for i, label in enumerate(classes)}


def split_indices(n: int, seed: int, train_fraction: float) -> tuple[list[int], list[int]]:
    """The tutorial's split: a seeded permutation, the first ``train_fraction`` for training.

    A pure function of (n, seed, fraction), so every rank and machine computes the same split.
    """
    perm = np.random.RandomState(seed).permutation(n)
    cut = int(train_fraction * n)
    return perm[:cut].tolist(), perm[cut:].tolist()


def check_fits_world(n_train: int, n_eval: int, world_size: int, batch_size: int, train_fraction: float,
                     where: str) -> None:
    """Every process needs real samples: one training batch and one evaluation image at least. With fewer,
    accelerate fills the gap by repeating samples (even_batches), and an accuracy over repeats of one
    image, or of none, is not a measurement. Raises DataError (exit 78) with the numbers and the
    smallest set that works."""
    if n_eval >= world_size and n_train > (world_size - 1) * batch_size:
        return
    smallest = smallest_set_for_world(world_size, batch_size, train_fraction)
    raise DataError(
        f"data ({where}): {n_train + n_eval} images, split {n_train} for training and {n_eval} for "
        f"evaluation (train_fraction {train_fraction}); {world_size} processes with batch_size {batch_size} "
        f"need at least {(world_size - 1) * batch_size + 1} training images (one batch each) and "
        f"{world_size} evaluation images (one each). The smallest set that works has {smallest} images; "
        "or use fewer processes (replicas x processesPerReplica) or a smaller batch_size"
    )


def smallest_set_for_world(world_size: int, batch_size: int, train_fraction: float) -> int:
    """The fewest images whose split (split_indices) gives every one of world_size processes a training
    batch and an evaluation image."""
    n = 2
    while True:
        cut = int(train_fraction * n)
        if n - cut >= world_size and cut > (world_size - 1) * batch_size:
            return n
        n += 1


# ------------------------------------------------------------------ datasets


Loader = Callable[[int], torch.Tensor]  # sample index -> uint8 CHW RGB tensor


def load_file_fast(path: Path) -> torch.Tensor:
    """Decode with torchvision.io (libjpeg-turbo, straight to a uint8 tensor); PIL for what it cannot read."""
    try:
        data = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8)
        return decode_jpeg(data, mode=ImageReadMode.RGB)
    except RuntimeError:
        return load_file_pil(path)


def load_file_pil(path: Path) -> torch.Tensor:
    try:
        with Image.open(path) as img:
            return pil_to_tensor(img.convert("RGB"))
    except Exception as err:
        raise CorruptImageError(
            f"data: image {str(path)!r} could not be decoded ({type(err).__name__}: {err})"
        ) from err


class PetsImages(Dataset[tuple[torch.Tensor, int]]):
    """Images as uint8 CHW tensors with their label ids; ToTensor's /255 and the normalisation happen on
    the device. Keys from :class:`EpochShuffleSampler` carry the epoch (``epoch * len + index``); a training
    sample's crop box is a function of (seed, epoch, index) (:func:`.crops.crop_boxes`): augmentation does
    not depend on the number of workers, on worker restarts, or on whether the run was resumed. Evaluation
    images are resized whole."""

    def __init__(self, load: Loader, labels: Sequence[int], size: int, seed: int, augment: bool):
        self.load = load
        self.labels = list(labels)
        self.size = size
        self.seed = seed
        self.augment = augment

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, key: int) -> tuple[torch.Tensor, int]:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: Sequence[int]) -> list[tuple[torch.Tensor, int]]:
        """The samples of a batch (a DataLoader asks for the batch at once): their boxes drawn together."""
        epochs, indices = zip(*(divmod(int(key), len(self.labels)) for key in keys), strict=True)
        images = self.crops([self.load(index) for index in indices], epochs, indices)
        return [(image, self.labels[index]) for image, index in zip(images, indices, strict=True)]

    def crops(self, images: list[torch.Tensor], epochs: Sequence[int], indices: Sequence[int]
              ) -> list[torch.Tensor]:
        """Each image's crop (sample ``indices[k]`` in ``epochs[k]``), resized by torchvision (antialiased
        bilinear); evaluation images resized whole."""
        size = [self.size, self.size]
        if not self.augment:
            return [TF.resize(image, size, antialias=True) for image in images]
        boxes = crop_boxes(self.seed, torch.tensor(epochs), torch.tensor(indices),
                           torch.tensor([image.shape[-2] for image in images]),
                           torch.tensor([image.shape[-1] for image in images]))
        return [TF.resized_crop(image, top, left, height, width, size, antialias=True)
                for image, (top, left, height, width) in zip(images, boxes.tolist(), strict=True)]

    def files(self) -> list[Path] | None:
        """Each sample's image file, when the set is read from files (None: the synthetic set)."""
        load = self.load
        if not isinstance(load, _Subset):
            return None
        paths = getattr(load.load_all, "paths", None)  # the files, or the sources of their store
        return None if paths is None else [paths[i] for i in load.indices]


class EpochShuffleSampler(Sampler[int]):
    """Shuffles like ``RandomSampler`` with the order a function of (seed, epoch); yields keys
    ``epoch * n + index`` so the dataset knows the epoch even in persistent workers. Given a plan
    (:meth:`set_plan`, :func:`.position.rank_plan`) it yields that plan's positions of the order, in turn:
    one rank's share of the epoch from a global position, at any world size."""

    def __init__(self, n: int, seed: int):
        self.n = n
        self.seed = seed
        self.epoch = 0
        self.plan: list[MicroStep] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_plan(self, plan: list[MicroStep] | None) -> None:
        self.plan = plan

    def order(self) -> torch.Tensor:
        """The epoch's permutation of the sample indices."""
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch))

    def __iter__(self) -> Iterator[int]:
        order = self.order()
        if self.plan is not None:
            order = torch.cat([order[m.start:m.end] for m in self.plan] or [order[:0]])
        return iter((order + self.epoch * self.n).tolist())

    def __len__(self) -> int:
        return self.n if self.plan is None else sum(m.size for m in self.plan)


@dataclass
class PetsData:
    train: PetsImages
    eval: PetsImages
    classes: list[str]
    skipped: list[tuple[Path, str]]
    source: str  # a line for the log
    report: dict[str, Any]  # what the trainer made of the data (dataset_report)

    @property
    def num_classes(self) -> int:
        return len(self.classes)


REPORT_SKIPPED_LIMIT = 1000  # names kept in the report; the count is always whole


def dataset_report(layout: str, root: str, labels: Sequence[str], skipped: Sequence[tuple[str, str]],
                   n_train: int, n_eval: int) -> dict[str, Any]:
    """What the trainer made of a dataset, written to ``dataset.json`` before the first step: the images
    found per class, the files skipped with their reasons, and the split. ``status.dataset`` and the
    summary carry its counts (``report_counts``)."""
    reasons = Counter(reason.split(" (")[0] for _name, reason in skipped)
    return {
        "layout": layout,
        "root": root,
        "images": len(labels),
        "classes": len(set(labels)),
        "per_class": dict(sorted(Counter(labels).items())),
        "skipped": len(skipped),
        "skipped_by_reason": dict(sorted(reasons.items())),
        "skipped_files": [{"file": name, "reason": why} for name, why in skipped[:REPORT_SKIPPED_LIMIT]],
        "train_images": n_train,
        "eval_images": n_eval,
    }


REPORT_COUNTS = ("layout", *DATASET_COUNTS)  # what the summary and status.dataset carry


def report_counts(report: dict[str, Any]) -> dict[str, Any]:
    """The report without its lists: what the summary and status hold."""
    return {key: report[key] for key in REPORT_COUNTS}


def write_report(report: dict[str, Any], output_dir: Path) -> Path:
    """``dataset.json`` in the output directory, written whole (temp name, then rename)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / DATASET_REPORT_FILE
    tmp = path.with_name(f".{DATASET_REPORT_FILE}.tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    tmp.replace(path)
    return path


def _split_datasets(
    load_all: Callable[[int], torch.Tensor],
    labels: list[int],
    seed: int,
    train_fraction: float,
    image_size: int,
    where: str,
) -> tuple[PetsImages, PetsImages]:
    train_idx, eval_idx = split_indices(len(labels), seed, train_fraction)
    if not train_idx or not eval_idx:
        raise DataError(
            f"data: {where} has {len(labels)} images; with train_fraction {train_fraction} the training "
            "or the evaluation set would be empty"
        )

    train = PetsImages(_Subset(load_all, train_idx), [labels[i] for i in train_idx], image_size, seed, True)
    evals = PetsImages(_Subset(load_all, eval_idx), [labels[i] for i in eval_idx], image_size, seed, False)
    return train, evals


class _Subset:
    """Picklable ``i -> load_all(indices[i])``."""

    def __init__(self, load_all: Loader, indices: list[int]):
        self.load_all = load_all
        self.indices = indices

    def __call__(self, i: int) -> torch.Tensor:
        return self.load_all(self.indices[i])


class _SyntheticLoader:
    """Picklable (for DataLoader workers) generator of synthetic image ``i``."""

    def __init__(self, samples: list[tuple[str, int]], num_classes: int, size: int, seed: int):
        self.samples = samples
        self.num_classes = num_classes
        self.size = size
        self.seed = seed

    def __call__(self, i: int) -> torch.Tensor:
        array = synthetic_image(self.seed, i, self.samples[i][1], self.num_classes, self.size)
        return torch.from_numpy(array).permute(2, 0, 1).contiguous()


class _FileLoader:
    def __init__(self, paths: list[Path], fast: bool):
        self.paths = paths
        self.fast = fast

    def __call__(self, i: int) -> torch.Tensor:
        return load_file_fast(self.paths[i]) if self.fast else load_file_pil(self.paths[i])


def build_data(
    data: str,
    image_size: int,
    seed: int,
    train_fraction: float,
    synthetic_classes: int,
    synthetic_images_per_class: int,
    fast_decode: bool = True,
    layout: str = "auto",
    check_index_dir: Path | None = None,
    write_check_index: bool = True,
) -> PetsData:
    """The data set and its split. A directory's images are checked first, each once per change when
    ``check_index_dir`` keeps the index of the checks (written only where ``write_check_index``: the local
    main process; the others read it)."""
    if data == SYNTHETIC:
        samples = synthetic_samples(synthetic_classes, synthetic_images_per_class)
        classes = synthetic_class_names(synthetic_classes)
        # generated a little larger than the crop, as photos are larger than 224
        loader = _SyntheticLoader(samples, synthetic_classes, round(image_size * 8 / 7), seed)
        labels = [label for _, label in samples]
        train, evals = _split_datasets(loader, labels, seed, train_fraction, image_size, "the synthetic set")
        source = f"synthetic: {synthetic_classes} classes x {synthetic_images_per_class} images (in memory)"
        report = dataset_report(SYNTHETIC, SYNTHETIC, [classes[label] for label in labels], [], len(train),
                                len(evals))
        return PetsData(train, evals, classes, [], source, report)

    listing = list_samples(Path(data), layout)
    checked = check_images(listing.root, [path for path, _label in listing.samples], check_index_dir,
                           write_check_index)
    log.info("image checks: %s", checked.line)
    files, unreadable = checked.ok, checked.unreadable
    skipped = sorted(listing.skipped + unreadable)
    where = repr(str(listing.root))
    if unreadable:
        shown = "; ".join(f"{p.relative_to(listing.root)}: {reason}" for p, reason in unreadable[:5])
        more = f" (and {len(unreadable) - 5} more)" if len(unreadable) > 5 else ""
        log.warning("skipped %d unreadable image(s) of %d in %s: %s%s", len(unreadable),
                    len(listing.samples), listing.root, shown, more)
    if not files:
        raise DataError(f"data: none of the images in {where} could be read ({len(unreadable)} corrupt)")
    label_of = dict(listing.samples)
    names = [label_of[p] for p in files]
    ids = label_ids(names, where)
    labels = [ids[name] for name in names]
    train, evals = _split_datasets(_FileLoader(files, fast_decode), labels, seed, train_fraction, image_size,
                                   where)
    counts = Counter(names)
    per_class = f"{min(counts.values())}-{max(counts.values())} per class"
    source = f"{listing.root} ({listing.layout}): {len(files)} images, {len(ids)} classes ({per_class})"
    report = dataset_report(listing.layout, str(listing.root), names,
                            [(str(p.relative_to(listing.root)), reason) for p, reason in skipped],
                            len(train), len(evals))
    return PetsData(train, evals, sorted(ids), skipped, source, report)
