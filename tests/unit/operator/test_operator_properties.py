"""Property tests (issue 28): what the operator reads from a training's pods, fed inputs hypothesis
generates. Rank 0's metrics page (`progress.parse_progress`, `check_progress`) and its termination
message (`pods.parse_summary`, then `mirror.summary`) are the pod's text, which the operator does
not trust: whatever it holds, they give numbers a status can hold (finite, within their field's range,
of the field's type) or the operator's own refusal (`ProgressError`, a None summary), and a refusal
never quotes the text (it goes into status conditions and Events).

The seeded generators of test_operator_scraper_hostile.py and test_operator_summary_hostile.py stay;
these add shrinking and structure (real metric names with hostile values, labels, HELP/TYPE lines,
recursive JSON). `derandomize=True`: CI runs the same examples every time; no example database.
"""

from __future__ import annotations

import copy
import json
import math
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from operator_specs import mirror_into  # tests/unit/operator/operator_specs.py
from pets_operator import pods
from pets_operator.progress import PETS_TEXT_CAP, ProgressError, check_progress, parse_progress
from pets_operator.status_types import Status
from prometheus_client.utils import floatToGoString

from pets_contract import gauges

pytestmark = pytest.mark.unit

PROPERTY = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MARKER = "SECRET-28-MARKER"  # what a hostile pod would like to see echoed into status and Events
METRICS = list(gauges.READ)
TOP = gauges.TOP
KEYS = "|".join(re.escape(str(gauge.field)) for gauge in gauges.READ.values())
# Every message parse_progress may raise, whole: the kind of failure and the status field, nothing else.
OWN_MESSAGE = re.compile(rf"not Prometheus text format|pets_\* lines over {PETS_TEXT_CAP // 1024} KiB"
                         rf"|value (?:out of range|of the wrong type|not an integer): (?:{KEYS})")
NOW = datetime(2026, 1, 2, tzinfo=UTC)


def assert_checked(values: object) -> None:
    """What a reading may hold: progress fields only, each a float, finite, 0..its top, integral for an
    integer field; and what it mirrors into status is JSON the API server takes."""
    assert isinstance(values, dict)
    for metric, value in values.items():
        assert metric in gauges.READ, metric
        kind, top = gauges.READ[metric].kind, gauges.READ[metric].top
        assert type(value) is float and math.isfinite(value) and 0 <= value <= top, (metric, value)
        assert kind is float or value.is_integer(), (metric, value)
    mirrored = mirror_into(Status(), progress=values, now=NOW).to_dict()
    json.dumps(mirrored, allow_nan=False)
    for gauge in gauges.group(gauges.PROGRESS):
        key = str(gauge.field)
        if gauge.name in values and not key.startswith("lastCheckpoint"):
            assert type(mirrored[key]) is gauge.kind and 0 <= mirrored[key] <= gauge.top, (key, mirrored[key])
    for part in ("epoch", "step"):  # lastCheckpoint: {epoch, step, time}, each a count when there
        value = (mirrored.get("lastCheckpoint") or {}).get(part)
        assert value is None or (type(value) is int and 0 <= value <= gauges.TOP), mirrored


def parse_or_refuse(text: str, parse: Callable[[str], dict[str, float]] = parse_progress) -> str:
    """parse(text) returns checked values, or raises ProgressError in its own words: 'ok' or 'refused'.
    Any other exception fails the property."""
    try:
        values = parse(text)
    except ProgressError as exc:
        message = str(exc)
        assert OWN_MESSAGE.fullmatch(message), message
        assert MARKER not in message
        event(f"refused: {message.split(':')[0]}")
        return "refused"
    assert_checked(values)
    event(f"read {len(values)} gauges" if values else "read nothing")
    return "ok"


# ----------------------------------------------------------------------------- the metrics page

# Names the page may hold: the trainer's own, their counter/histogram suffixes, near misses and others.
NAMES = st.one_of(
    st.sampled_from(METRICS),
    st.builds(lambda m, s: m + s, st.sampled_from(METRICS),
              st.sampled_from(["_total", "_created", "_count", "_sum", "_bucket", "_info", "x", ":a"])),
    st.sampled_from(["pets_", "pets", "pets_unknown", "other_metric", "process_cpu_seconds_total", MARKER]),
)
BOUNDARY_INTS = [0, 1, TOP - 1, TOP, TOP + 1, 2**63 - 1, 2**63, 2**64, -1, -(2**63) - 1, 10**30]
GARBAGE = ["NaN", "nan", "+Inf", "-Inf", "inf", "Infinity", "1e400", "-1e400", "1e-400", "-0", "-0.0", "0x10",
           "1_0", "0b1", "1e", ".", "", "١٢", "٣.٥", "1,5", "--1", "+1", "1.", ".5", "1e16", "9" * 400,
           "9" * 5000, MARKER, "{", "}", '"', "\\", "\x00", "\ufffd"]
VALUES = st.one_of(
    st.integers(0, 10**6).map(str),  # values in range, as often as the hostile ones below
    st.floats(0, 1).map(repr),
    st.floats().map(repr),  # nan, inf, huge, subnormal, -0.0
    st.floats().map(floatToGoString),  # as prometheus_client writes them: NaN, +Inf, 1.0e+16
    st.integers().map(str),  # beyond 2**53 and int64 both ways
    st.sampled_from(BOUNDARY_INTS).map(str),
    st.sampled_from(GARBAGE),
    st.text(max_size=12),
)
LABEL_VALUES = st.one_of(st.text(max_size=20), st.just(MARKER), st.sampled_from(['\\"', "\\n", "\\\\", "\\"]))
LABELS = st.one_of(
    st.just(""),
    st.dictionaries(st.sampled_from(["a", "rank", "le", "quantile", "__name__", MARKER, "0x", "a-b", ""]),
                    LABEL_VALUES, max_size=3)
      .map(lambda d: "{" + ",".join(f'{k}="{v}"' for k, v in d.items()) + "}"),
    st.sampled_from(["{", "}", "{}", "{a}", '{a="b"', '{a="b",}', "{,}", '{a="' + MARKER]),
)
SEP = st.sampled_from([" ", "\t", "  ", " \t"])
SAMPLE = st.builds(lambda n, lab, sep, v, ts: f"{n}{lab}{sep}{v}{ts}", NAMES, LABELS, SEP, VALUES,
                   st.one_of(st.just(""), st.builds(lambda s, v: s + v, SEP, VALUES)))
HELP = st.builds(lambda n, t: f"# HELP {n} {t}", NAMES, st.one_of(st.text(max_size=30), st.just(MARKER)))
TYPE = st.builds(lambda n, t: f"# TYPE {n} {t}", NAMES,
                 st.sampled_from(["gauge", "counter", "untyped", "histogram", "summary", "info", "stateset",
                                  "gaugehistogram", "unknown", "", MARKER]))
LONG = st.builds(lambda n, k, v: f'{n}{{a="{"x" * k}"}} {v}', NAMES, st.sampled_from([300, 3000]), VALUES)
LINE = st.one_of(SAMPLE, SAMPLE, HELP, TYPE, st.text(max_size=40), st.just(f"# {MARKER}"), LONG)
HUGE = f'pets_epoch{{a="{"x" * PETS_TEXT_CAP}"}} 1'  # past the cap by itself
PAGE = st.builds(lambda lines, eol, end, huge: eol.join(lines + ([HUGE] if huge == 0 else [])) + end,
                 st.lists(LINE, max_size=25), st.sampled_from(["\n", "\r\n", "\n\n"]),
                 st.sampled_from(["", "\n", "# EOF\n"]), st.integers(0, 9))


# The format's own characters: text that gets past the pets_* filter into the Prometheus parser.
FORMAT_TEXT = st.text(alphabet=st.sampled_from(list('pets_ochl{}="\\ \t\n\r#TYPEHLP0123456789.eE+-naNIf,')))


@PROPERTY
@given(st.one_of(st.text(), FORMAT_TEXT, st.builds(lambda m, t: m + t, st.sampled_from(METRICS), st.text())))
@example("pets_epoch " + "9" * 5000)
@example("pets_epoch 1 " + "9" * 400)  # a timestamp no float holds
def test_any_text_reads_checked_or_is_refused_in_our_words(text: str) -> None:
    parse_or_refuse(text)


@PROPERTY
@given(st.binary())
def test_any_bytes_as_the_scraper_decodes_them(body: bytes) -> None:
    parse_or_refuse(body.decode("utf-8", "replace"))


@PROPERTY
@given(PAGE)
@example(f"# HELP pets_epoch {MARKER}\npets_epoch 3\npets_images_per_second +Inf\n")
@example(f'pets_step{{a="{MARKER}"}} 9223372036854775808\n')
@example("pets_epoch{le=\"1\"} 2.5\n")
@example("pets_epoch 1\n" * (PETS_TEXT_CAP // 13 + 1))
def test_a_generated_page_of_the_trainers_metrics_reads_checked_or_is_refused(page: str) -> None:
    parse_or_refuse(page)


@PROPERTY
@given(PAGE, st.sampled_from(["", "\n", "\r\n"]))
def test_the_marker_never_reaches_an_error_wherever_it_is_put(page: str, eol: str) -> None:
    """The same page with the marker as a line of its own, a HELP text, a label value and a value."""
    for hostile in (f"{MARKER}{eol}", f"# HELP pets_epoch {MARKER}\n", f'pets_epoch{{a="{MARKER}"}} 1\n',
                    f"pets_epoch {MARKER}\n", f"pets_{MARKER} 1\n"):
        parse_or_refuse(hostile + page)
        parse_or_refuse(page + "\n" + hostile)


def _in_range(metric: str) -> st.SearchStrategy[float | int]:
    kind, top = gauges.READ[metric].kind, gauges.READ[metric].top
    if kind is int:
        return st.integers(0, top)
    return st.floats(0, top, allow_nan=False)


@PROPERTY
@given(st.dictionaries(st.sampled_from(METRICS), st.none(), min_size=1).flatmap(
    lambda d: st.fixed_dictionaries({m: _in_range(m) for m in d})), st.booleans(), LABELS)
def test_a_page_of_in_range_values_reads_back_exactly(values: dict[str, float], as_go: bool,
                                                      labels: str) -> None:
    """The other side of the property: the trainer's page, however its in-range values are written,
    reads back as those values (so the refusals above are not all the parser ever does)."""
    lines = []
    for metric, value in values.items():
        text = floatToGoString(value) if as_go else repr(value)
        lines += [f"# HELP {metric} {MARKER}", f"# TYPE {metric} gauge", f"{metric} {text}"]
    got = parse_progress("\n".join(lines) + "\n")
    assert got == {m: float(v) for m, v in values.items()}
    assert_checked(got)


RAW_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from(BOUNDARY_INTS), st.floats(),
                       st.text(max_size=5), st.binary(max_size=5), st.fractions(), st.decimals(),
                       st.complex_numbers(), st.lists(st.integers(), max_size=2))


@PROPERTY
@given(st.dictionaries(st.one_of(st.sampled_from(METRICS), st.text(max_size=10)), RAW_VALUES))
def test_check_progress_of_any_mapping_gives_checked_values_or_our_error(raw: dict[str, Any]) -> None:
    outcome = parse_or_refuse("", lambda _text: check_progress(raw))
    if outcome == "ok":
        for metric, value in raw.items():
            if metric in gauges.READ and not (isinstance(value, float) and math.isnan(value)):
                assert metric in check_progress(raw)


# ----------------------------------------------------------------------------- the termination message

JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from(BOUNDARY_INTS),
                         st.floats(), st.text(max_size=10), st.just(MARKER))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=20)
SUMMARY_KEYS = ["status", "epochs", "final_accuracy", "best_accuracy", "final_train_loss",
                "images_per_second", "elapsed_seconds", "world_size", "model", "num_classes", "output_dir",
                "error"]
SUMMARIES = st.dictionaries(st.one_of(st.sampled_from(SUMMARY_KEYS), st.text(max_size=8)), JSON_VALUES,
                            max_size=12)


def _depth(value: object) -> int:
    """Nesting of a JSON value: 0 for a scalar, 1 for a flat object or array."""
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _holdable(value: object) -> bool:
    """Every number in it one a status can hold: finite floats, integers within 2**53."""
    if isinstance(value, dict):
        return all(map(_holdable, value.values()))
    if isinstance(value, list):
        return all(map(_holdable, value))
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) <= TOP
    return True


def assert_summary_fits_a_status(summary: object, total_epochs: int) -> None:
    """A parsed summary: a dict, whose numbers a status holds, which serialises and copies even from
    deep in kopf's stack, and whose mirrored fields are within range."""
    assert isinstance(summary, dict)
    assert _holdable(summary)
    assert _depth(summary) <= pods.SUMMARY_MAX_DEPTH
    json.dumps(summary, allow_nan=False)
    copy.deepcopy(summary)
    mirrored = mirror_into(Status(), summary=summary, epochs=total_epochs).to_dict()
    json.dumps(mirrored, allow_nan=False)
    for key, top in (("evalAccuracy", 1.0), ("trainLoss", TOP), ("imagesPerSecond", TOP)):
        if key in mirrored:
            assert type(mirrored[key]) is float and 0 <= mirrored[key] <= top, (key, mirrored[key])
    if "epoch" in mirrored:
        assert type(mirrored["epoch"]) is int and 0 <= mirrored["epoch"] <= TOP
        assert mirrored["progress"] == f"{mirrored['epoch']}/{total_epochs}"


@PROPERTY
@given(SUMMARIES, st.integers(1, 1000))
def test_a_generated_summary_reads_whole_or_not_at_all(summary: dict[str, Any], total_epochs: int) -> None:
    """The JSON the trainer could write (NaN and Infinity as Python writes them): read back equal when
    every number fits a status, else unreadable (None), never half read, never an exception."""
    got = pods.parse_summary(json.dumps(summary))
    if _holdable(summary) and _depth(summary) <= pods.SUMMARY_MAX_DEPTH:
        assert got == summary
        assert_summary_fits_a_status(got, total_epochs)
    else:
        assert got is None


@PROPERTY
@given(JSON_VALUES)
def test_a_summary_that_is_not_an_object_is_unreadable(value: Any) -> None:
    got = pods.parse_summary(json.dumps(value))
    assert got is None or (isinstance(value, dict) and got == value)


@PROPERTY
@given(st.one_of(st.text(), st.binary().map(lambda b: b.decode("utf-8", "replace")), st.none()))
@example('{"a": ' + "[" * 5000 + "]" * 5000 + "}")
@example('{"a": ' + "[" * 900 + "]" * 900 + "}")
@example('{"epochs": ' + "9" * 5000 + "}")
def test_any_termination_message_is_a_summary_a_status_holds_or_none(message: str | None) -> None:
    got = pods.parse_summary(message)
    if got is not None:
        assert_summary_fits_a_status(got, 5)


@PROPERTY
@given(st.integers(0, 3 * sys.getrecursionlimit()), st.sampled_from(["[", '{"k": ']), JSON_SCALARS,
       st.booleans())
def test_a_deeply_nested_summary_is_unreadable_not_a_crash(depth: int, opener: str, leaf: Any,
                                                          closed: bool) -> None:
    """A 4 KiB termination message nests 4000 deep: json's recursion limit (RecursionError) or, a little
    less deep, kopf's own deepcopy and serialisation of the status would fail on every round."""
    closer = "]" if opener == "[" else "}"
    inner = opener * depth + json.dumps(leaf) + (closer * depth if closed else "")
    got = pods.parse_summary('{"status": "succeeded", "nested": ' + inner + "}")
    if got is not None:
        assert_summary_fits_a_status(got, 5)
        assert depth + 1 <= pods.SUMMARY_MAX_DEPTH


@PROPERTY
@given(st.dictionaries(st.one_of(st.sampled_from(SUMMARY_KEYS), st.text(max_size=8)),
                       st.one_of(RAW_VALUES, JSON_VALUES)), st.integers(0, 2**60))
def test_mirroring_any_summary_puts_only_in_range_fields_in_status(summary: dict[str, Any],
                                                                   total_epochs: int) -> None:
    """mirror.summary, whatever dict it is handed: the fields it sets are within range."""
    mirrored = mirror_into(Status(), summary=summary, epochs=total_epochs).to_dict()
    for key, top in (("evalAccuracy", 1.0), ("trainLoss", TOP), ("imagesPerSecond", TOP)):
        if key in mirrored:
            assert type(mirrored[key]) is float and math.isfinite(mirrored[key]) and 0 <= mirrored[key] <= top
    if "epoch" in mirrored:
        assert type(mirrored["epoch"]) is int and 0 <= mirrored["epoch"] <= TOP
