"""Storage quantities as the PetsTraining API admits them (spec.dataset.cache.size, the output claim's
size): the CRD's pattern, which the operator's rules check, and a quantity's bytes, which the dataset
initializer counts against (the trainer's side has no kubernetes client to parse one)."""

from __future__ import annotations

import re

# A non-negative resource.Quantity (a number and an optional suffix: 3Gi, 512Mi, 1.5, 500m, 1e3), as
# resource.ParseQuantity reads it, slightly narrowed (no sign, no "1.", exponents of at most 2 digits),
# so every value it admits is one the Job accepts. No backslash: it also sits in a CEL string literal.
PATTERN = r"^([0-9]+([.][0-9]+)?|[.][0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][-+]?[0-9]{1,2})?$"
_MATCH = re.compile(PATTERN.removesuffix("$") + r"\Z")  # Go's `$` is the end of the text
_EXPONENT = re.compile(r"[eE]([-+]?[0-9]{1,2})")
_SCALE = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60,
          "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
          "E": 10**18, "": 1}


def to_bytes(text: str) -> int | None:
    """The quantity in bytes (rounded down), or None when PATTERN does not admit ``text``."""
    m = _MATCH.match(text)
    if m is None:
        return None
    number, _fraction, suffix = m.groups()
    exponent = _EXPONENT.fullmatch(suffix or "")  # "1E3" is an exponent, "1E" the suffix exa
    scale = 10 ** int(exponent.group(1)) if exponent else _SCALE[suffix or ""]
    return int(float(number) * scale)
