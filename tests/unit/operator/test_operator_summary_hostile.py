"""The trainer's termination message is the pod's text too (issue 28): the whole summary goes into
status, so a number a status cannot hold (NaN, Infinity, 1e400, an integer beyond 2**53) makes the summary
unreadable instead of a status patch the API server refuses on every round."""

from __future__ import annotations

import json

import pytest
from operator_specs import mirror_into  # tests/unit/operator/operator_specs.py
from pets_operator import pods
from pets_operator.status_types import Status

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text", [
    '{"status": "succeeded", "final_accuracy": NaN}',
    '{"status": "succeeded", "final_accuracy": Infinity}',
    '{"status": "succeeded", "images_per_second": -Infinity}',
    '{"status": "succeeded", "final_train_loss": 1e400}',
    '{"status": "succeeded", "epochs": 99999999999999999999}',
    '{"status": "succeeded", "nested": {"deep": [1, 2, NaN]}}',
    '{"status": "succeeded", "epochs": ' + "9" * 5000 + "}",
])
def test_a_summary_with_a_number_no_status_can_hold_is_unreadable(text: str) -> None:
    assert pods.parse_summary(text) is None


def test_a_real_summary_still_reads_and_mirrors() -> None:
    summary = pods.parse_summary(json.dumps({"status": "succeeded", "final_accuracy": 0.99375, "epochs": 5,
                                             "final_train_loss": 0.0386, "images_per_second": 301.7}))
    assert summary is not None
    st = mirror_into(Status(), summary=summary)
    assert (st.eval_accuracy, st.epoch, st.progress) == (0.99375, 5, "5/5")
    json.dumps(st.to_dict(), allow_nan=False)  # a patch the API server takes


@pytest.mark.parametrize("bad", [{"final_accuracy": 1.5}, {"final_accuracy": -0.1}, {"final_accuracy": True},
                                 {"final_accuracy": "0.9"}, {"epochs": -1}, {"epochs": 2.5},
                                 {"images_per_second": 2**60}])
def test_values_out_of_their_fields_range_are_not_mirrored(bad: dict[str, object]) -> None:
    st = mirror_into(Status(), summary={"status": "succeeded", **bad})
    assert not {"evalAccuracy", "epoch", "imagesPerSecond"} & st.to_dict().keys(), st
