"""Rank 0's progress endpoint (Prometheus text, docs/contract.md) -> the gauges the status mirrors."""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from pets_operator.status import PROGRESS_FIELDS


def parse_progress(text: str) -> dict[str, float]:
    """The `pets_*` gauges of a scrape, by metric name. Unknown metrics and NaNs are ignored."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in PROGRESS_FIELDS:
            continue
        for sample in family.samples:
            if sample.name == family.name and not math.isnan(sample.value):
                out[family.name] = float(sample.value)
    return out
