"""Rank 0's progress endpoint (Prometheus text, docs/contract.md) -> the gauges the status mirrors.

The text comes from a training pod, which the operator does not trust: whatever it holds, `parse_progress`
returns checked numbers or raises `ProgressError`, whose message names the kind of failure (and the
status field) and never quotes the text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from pets_contract import summary as summary_keys
from pets_contract.gauges import READ, TOP

# Only `pets_*` samples and their HELP/TYPE lines reach the Prometheus parser: it is pure Python, and a
# scrape is parsed on the event loop, so other samples must cost a regex scan, not a parse.
_PETS_LINE = re.compile(r"^(?:# (?:HELP|TYPE) )?pets_.*$", re.MULTILINE)
PETS_TEXT_CAP = 16 * 1024


class ProgressError(ValueError):
    """A scrape that gives no progress; the message is ours (the kind of failure), never the pod's text."""


def parse_progress(text: str) -> dict[str, float]:
    """The `pets_*` gauges of a scrape, by metric name, each checked (`check_progress`). Unknown metrics
    and NaNs (Prometheus' "no value") are ignored; anything else wrong raises `ProgressError`."""
    lines = "\n".join(m.group(0) for m in _PETS_LINE.finditer(text))
    if len(lines) > PETS_TEXT_CAP:
        raise ProgressError(f"pets_* lines over {PETS_TEXT_CAP // 1024} KiB")
    raw: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(lines + "\n"):
            if family.name not in READ:
                continue
            for sample in family.samples:
                if sample.name == family.name:
                    raw[family.name] = sample.value
    except Exception as exc:  # the parser's messages quote the offending line: never pass them on
        raise ProgressError("not Prometheus text format") from exc
    return check_progress(raw)


def check_progress(raw: Mapping[str, object]) -> dict[str, float]:
    """Every value as the status field it feeds can hold it: a real number (not a bool), finite, within
    0..the field's top (`pets_contract.gauges`: 2**53, or 1 for an accuracy), integral for integer fields.
    NaN is dropped; a metric that is not a progress field is dropped. A failure raises `ProgressError`
    naming the status field (`value out of range: imagesPerSecond`): nothing out of range, infinite or
    beyond int64 ever reaches a status patch (the API server refuses such a patch, and `int(inf)` raises)."""
    out: dict[str, float] = {}
    for metric, value in raw.items():
        if (gauge := READ.get(metric)) is None:
            continue
        key = gauge.field
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProgressError(f"value of the wrong type: {key}")
        if isinstance(value, float) and math.isnan(value):
            continue
        if not 0 <= value <= gauge.top:  # infinities fail here; a big int is compared exactly
            raise ProgressError(f"value out of range: {key}")
        number = float(value)
        if gauge.kind is int and not number.is_integer():
            raise ProgressError(f"value not an integer: {key}")
        out[metric] = number
    return out


def in_range(value: Any, top: float = TOP) -> bool:
    """A number (not a bool) in 0..top: a figure from rank 0 that a status can hold."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= top


def is_count(value: Any) -> bool:
    """An integer in 0..gauges.TOP: a count from the summary a status can hold."""
    return isinstance(value, int) and in_range(value)


def summary_step(summary: Mapping[str, Any] | None) -> int | None:
    """The global step a run's final summary says it reached: exact, where a progress read may be behind
    (None: no summary, a trainer older than the key, or a failure before its training loop)."""
    step = (summary or {}).get(summary_keys.GLOBAL_STEP)
    return step if is_count(step) else None
