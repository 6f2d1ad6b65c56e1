"""The built-in synthetic Pets set: class names from the 37 Oxford-IIIT Pet breeds, and deterministic images
of each class, in memory or written as ``<breed>_<n>.jpg`` files. numpy and PIL only (no torch), so a
benchmark or a test that only writes the set does not import the trainer's stack."""

from __future__ import annotations

import colorsys
import math
from pathlib import Path

import numpy as np
from PIL import Image

# The 37 Oxford-IIIT Pet breeds, used as class names of the synthetic set.
BREEDS = (
    "Abyssinian american_bulldog american_pit_bull_terrier basset_hound beagle Bengal Birman Bombay boxer "
    "British_Shorthair chihuahua Egyptian_Mau english_cocker_spaniel english_setter german_shorthaired "
    "great_pyrenees havanese japanese_chin keeshond leonberger Maine_Coon miniature_pinscher newfoundland "
    "Persian pomeranian pug Ragdoll Russian_Blue saint_bernard samoyed scottish_terrier shiba_inu Siamese "
    "Sphynx staffordshire_bull_terrier wheaten_terrier yorkshire_terrier"
).split()


def synthetic_class_names(num_classes: int) -> list[str]:
    return [BREEDS[k] if k < len(BREEDS) else f"breed{k}" for k in range(num_classes)]


def synthetic_image(seed: int, index: int, label: int, num_classes: int, size: int) -> np.ndarray:
    """A deterministic ``size x size x 3`` uint8 image of class ``label``.

    Each class has its own colour (hue) and its own stripe orientation and frequency, painted on an
    elliptic "pet" at a random place and size over a random background, with pixel noise. The image
    depends only on (seed, index, label, num_classes, size).
    """
    rng = np.random.default_rng([seed, index])
    hue = (label / num_classes + rng.uniform(-0.15, 0.15) / num_classes) % 1.0
    colour = np.array(colorsys.hsv_to_rgb(hue, 0.8, rng.uniform(0.75, 1.0))) * 255.0
    angle = ((label * 0.3819660112501051) % 1.0) * math.pi
    freq = 3.0 + 3.0 * (label % 3)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    stripes = 0.5 + 0.5 * np.sin(
        2 * math.pi * freq * (xx * math.cos(angle) + yy * math.sin(angle)) + rng.uniform(0, 6.3)
    )
    cy, cx = rng.uniform(0.35, 0.65, size=2)
    ry, rx = rng.uniform(0.25, 0.45, size=2)
    inside = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0
    background = (
        np.array(colorsys.hsv_to_rgb(rng.uniform(), rng.uniform(0.0, 0.3), rng.uniform(0.2, 0.9))) * 255.0
    )
    img = np.empty((size, size, 3), dtype=np.float32)
    img[:] = background
    img[inside] = colour * (0.6 + 0.4 * stripes[inside, None])
    img += rng.normal(0.0, 12.0, size=img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def synthetic_samples(num_classes: int, per_class: int) -> list[tuple[str, int]]:
    """(file name, label id) of the synthetic set in sorted file-name order, like a directory listing."""
    names = synthetic_class_names(num_classes)
    items = [(f"{names[k]}_{n}.jpg", k) for k in range(num_classes) for n in range(per_class)]
    return sorted(items)


def write_synthetic(
    out_dir: Path, num_classes: int, per_class: int, size: int, seed: int, quality: int = 90
) -> int:
    """Write the synthetic set as ``<label>_<n>.jpg`` files; returns how many were written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    samples = synthetic_samples(num_classes, per_class)
    for index, (name, label) in enumerate(samples):
        Image.fromarray(synthetic_image(seed, index, label, num_classes, size)).save(
            out_dir / name, quality=quality
        )
    return len(samples)
