"""The training crop (RandomResizedCrop's: 0.5 to 1 of the area, aspect ratio 3/4 to 4/3, then an
antialiased bilinear resize to ``size`` x ``size``) in two pieces that take a whole batch at once.

- :func:`crop_boxes`: each sample's box, a function of (seed, epoch, index) alone, drawn by a counter-based
  hash: no generator state and no global reseed, so a box is the same in any batch, with any number of
  workers, after a resume. It uses + - x / and sqrt in float64 (exp as a fixed polynomial), which round
  the same alone or vectorised: one sample's box is the same bit for bit alone or in a batch.
- :func:`resize_boxes`: the boxes of a batch of images of any sizes, the images laid one after the other in
  one flat uint8 buffer, resized together: per axis a gather of bands and one batched matrix product, so
  the number of operations does not grow with the batch. The matrices hold torch's antialiased bilinear
  filter (a triangle widened by the scale, clipped to the box), the horizontal pass rounded to uint8 as
  torch's uint8 kernel rounds it.

The CPU path crops one image at a time with torchvision (``resized_crop``) from the same box; the batched
resize is within 2 levels of 255 of it, 0.01-0.03 on average (test_crops.py).
"""

from __future__ import annotations

import math
from typing import TypeVar

import torch

SCALE = (0.5, 1.0)  # of the image's area
RATIO = (3 / 4, 4 / 3)  # width / height
ATTEMPTS = 10  # boxes tried before the fallback, as torchvision tries
MASK = 0xFFFFFFFF
LOG_RATIO = (math.log(RATIO[0]), math.log(RATIO[1]))
EXP_TERMS = [1 / math.factorial(k) for k in range(9)]  # exp on |x| <= log(4/3), within 5e-9
CHANNELS = 3  # every image is decoded as RGB
BLOCK = 16  # output pixels per block of the resize; a block reads a band of its box, BLOCK x scale long

Int = TypeVar("Int", int, torch.Tensor)


def _mix(x: Int) -> Int:
    """A 32-bit integer hash (multiply-xorshift) of values below 2**32 (ints, or int64 tensors, where no
    product overflows)."""
    x = (((x >> 16) ^ x) * 0x45D9F3B) & MASK
    x = (((x >> 16) ^ x) * 0x45D9F3B) & MASK
    return (x >> 16) ^ x


def uniforms(seed: int, epoch: torch.Tensor, index: torch.Tensor, draws: int) -> torch.Tensor:
    """(N, draws) float64 in [0, 1): each a hash of (seed, epoch, index, draw)."""
    seed_key = _mix((seed & MASK) ^ _mix((seed >> 32) & MASK))
    key = _mix(_mix((epoch & MASK) ^ seed_key) ^ (index & MASK))
    counter = (torch.arange(1, draws + 1) * 0x9E3779B9) & MASK  # a Weyl sequence: draws far apart
    return _mix(key[:, None] ^ counter).double() / 2**32


def _exp(x: torch.Tensor) -> torch.Tensor:
    """exp by its Taylor polynomial (Horner), within 5e-9 on |x| <= 0.29: + and x alone, which round the
    same in scalar and vector code (torch.exp may differ in the last bit)."""
    out = torch.full_like(x, EXP_TERMS[-1])
    for term in reversed(EXP_TERMS[:-1]):
        out = out * x + term
    return out


def crop_boxes(seed: int, epoch: torch.Tensor, index: torch.Tensor, heights: torch.Tensor,
               widths: torch.Tensor) -> torch.Tensor:
    """(N, 4) int64 boxes (top, left, height, width) of RandomResizedCrop for the samples ``index`` of
    ``epoch`` (int64 CPU tensors), in images of ``heights`` x ``widths``: up to ATTEMPTS boxes of a random
    area and aspect ratio, the first that fits; none fits: the whole image, its ratio clamped to RATIO."""
    u = uniforms(seed, epoch, index, 2 * ATTEMPTS + 2)
    height, width = heights[:, None], widths[:, None]
    target = (height * width).double() * (SCALE[0] + (SCALE[1] - SCALE[0]) * u[:, :ATTEMPTS])
    aspect = _exp(LOG_RATIO[0] + (LOG_RATIO[1] - LOG_RATIO[0]) * u[:, ATTEMPTS:2 * ATTEMPTS])
    w = (target * aspect).sqrt().round().long()
    h = (target / aspect).sqrt().round().long()
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = fits.byte().argmax(dim=1, keepdim=True)  # the first attempt that fits
    found = fits.any(dim=1)
    heights, widths = heights.long(), widths.long()
    ratio = widths.double() / heights.double()
    whole_w = torch.where(ratio > RATIO[1], (heights * RATIO[1]).round().long(), widths)
    whole_h = torch.where(ratio < RATIO[0], (widths / RATIO[0]).round().long(), heights)
    h = torch.where(found, h.gather(1, first)[:, 0], whole_h)
    w = torch.where(found, w.gather(1, first)[:, 0], whole_w)
    top = torch.where(found, (u[:, -2] * (heights - h + 1)).floor().long(), (heights - h) // 2)
    left = torch.where(found, (u[:, -1] * (widths - w + 1)).floor().long(), (widths - w) // 2)
    return torch.stack([top, left, h, w], dim=1)


def _bands(length: torch.Tensor, size: int, box_max: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """One axis of the resize, in blocks of BLOCK output pixels: each block reads one band of ``band``
    consecutive pixels of its box. Returns each block's band start in its box, (N, blocks) int64; the
    weights, (N, blocks, BLOCK, band) float32: torch's antialiased bilinear filter (a triangle as wide as
    the scale when it shrinks, clipped to the box, normalised); and ``band``. ``length``: the boxes'
    lengths on this axis; ``box_max``: the longest (a host int)."""
    blocks = -(-size // BLOCK)
    widest = box_max / size
    band = min(box_max, math.ceil((BLOCK - 1) * widest + 2 * max(widest, 1.0)) + 2)
    scale = length.float() / size
    support = scale.clamp(min=1.0)[:, None, None, None]
    out = torch.arange(blocks * BLOCK, device=length.device).view(blocks, BLOCK)
    centre = (out + 0.5) * scale[:, None, None]  # (N, blocks, BLOCK), in the box's pixels
    first = (centre[:, :, 0] - support[:, :, 0, 0]).floor().long().clamp(min=0)
    first = torch.minimum(first, (length[:, None] - band).clamp(min=0))  # the band stays in the box
    source = first[:, :, None] + torch.arange(band, device=length.device)  # (N, blocks, band)
    weights = (1 - (source[:, :, None] + 0.5 - centre[..., None]).abs() / support).clamp(min=0)
    weights = weights * (source < length[:, None, None])[:, :, None]
    return first, weights / weights.sum(dim=-1, keepdim=True).clamp(min=1e-12), band


def resize_boxes(flat: torch.Tensor, layout: torch.Tensor, boxes: torch.Tensor, size: int,
                 box_max: tuple[int, int]) -> torch.Tensor:
    """(N, 3, size, size) uint8: box ``n`` of image ``n``, resized. ``flat``: the images, uint8 CHW RGB
    one after the other, followed by at least ``box_max[1]`` bytes; ``layout``: (N, 3) int64, each image's
    offset in ``flat``, its height and width; ``boxes``: (N, 4) from :func:`crop_boxes`; ``box_max``:
    the largest box height and width of the batch (host ints). Tensors on ``flat``'s device.

    Each pass is a gather of bands (every window of ``band`` bytes of ``flat`` is a row of its ``unfold``
    view) and one batched product with their weights: the horizontal pass, rounded to uint8, then the
    vertical one."""
    offset, height, width = (layout[:, k, None, None] for k in range(3))
    top, left, h, w = boxes.unbind(dim=1)
    n, c, (box_h, box_w) = layout.shape[0], CHANNELS, box_max
    device = flat.device
    # each box's rows (past its height: its last row again, weighed 0), (N, C, box_h)
    row = torch.minimum(torch.arange(box_h, device=device), h[:, None, None] - 1)
    rows = offset + (torch.arange(c, device=device)[:, None] * height + top[:, None, None] + row) * width
    first, weights, band = _bands(w, size, box_w)
    blocks = first.shape[1]
    starts = rows[:, None] + (left[:, None] + first)[:, :, None, None]  # (N, blocks, C, box_h)
    pixels = flat.unfold(0, band, 1).index_select(0, starts.flatten()).view(n, blocks, c * box_h, band)
    # weights >= 0 summing to 1: every value stays in [0, 255], rounded as torch's uint8 kernel rounds
    across = (pixels.float() @ weights.transpose(2, 3)).round_()  # (N, blocks, C * box_h, BLOCK)
    across = across.view(n, blocks, c * box_h, BLOCK).transpose(1, 2).reshape(n * c * box_h, -1)
    first, weights, band = _bands(h, size, box_h)
    picks = ((torch.arange(n, device=device)[:, None, None, None] * c
              + torch.arange(c, device=device)[:, None]) * box_h
             + first[:, :, None, None] + torch.arange(band, device=device))  # (N, blocks, C, band)
    rows_across = across.index_select(0, picks.flatten()).view(n, blocks, c, band, -1)
    down = (weights[:, :, None] @ rows_across).round_().to(torch.uint8)  # (N, blocks, C, BLOCK, width)
    return down.transpose(1, 2).reshape(n, c, blocks * BLOCK, -1)[:, :, :size, :size]
