"""`kubectl pets run --watch` and `wait()`'s live bar, fed the status stream recorded in issue 21: one
bar, one unit (steps over all epochs, the epoch in its description), no rate from the first reading's
jump, and 100 % at Succeeded."""

from __future__ import annotations

import io

import pytest

from pets_client.client import _Reporter

pytestmark = pytest.mark.unit

# What the operator wrote for a 3-epoch, 2-replica training, in order (the bar used to print 0/3 epochs,
# then 0/6, then 4/6 at 14004 step/s, and stay at 4/6 after Succeeded).
RECORDED = [
    {"phase": "Pending", "replicas": 2, "totalEpochs": 3, "message": "waiting for the Job's pods"},
    {"phase": "Running", "replicas": 2, "readyReplicas": 2, "totalEpochs": 3},
    {"phase": "Running", "replicas": 2, "readyReplicas": 2, "totalEpochs": 3, "step": 0, "stepsTotal": 6},
    {"phase": "Running", "replicas": 2, "readyReplicas": 2, "totalEpochs": 3, "epoch": 2, "step": 4,
     "stepsTotal": 6, "trainLoss": 0.5, "evalAccuracy": 0.75, "imagesPerSecond": 30.0},
    {"phase": "Succeeded", "replicas": 2, "totalEpochs": 3, "epoch": 3, "step": 4, "stepsTotal": 6,
     "evalAccuracy": 0.9, "summary": {"final_accuracy": 0.9}},
]


def test_the_recorded_stream_draws_one_bar_of_steps_that_ends_full() -> None:
    out = io.StringIO()
    rep = _Reporter("pets", True, out)
    states = []
    for status in RECORDED:
        rep.update(status)
        bar = rep.bar
        states.append(None if bar is None else (bar.n, bar.total, bar.unit, bar.desc))
    assert states == [
        None,  # no steps known: no bar (not an epoch bar that later turns into a step bar)
        None,
        (0, 6, "step", "pets epoch 1/3"),
        (4, 6, "step", "pets epoch 3/3"),
        (6, 6, "step", "pets epoch 3/3"),
    ]
    rep.close(RECORDED[-1])
    text = out.getvalue()
    assert "epoch/s" not in text and "/3 [" not in text  # never a bar of epochs
    assert "100%" in text and "6/6" in text
    assert text.rstrip().endswith("pets: Succeeded, final accuracy 0.9000 (90.0%), epoch 3/3")


def test_a_bar_that_appears_mid_run_shows_no_rate_from_the_steps_before_it() -> None:
    out = io.StringIO()
    rep = _Reporter("pets", True, out)
    rep.update({"phase": "Running", "totalEpochs": 3, "step": 400, "stepsTotal": 600})
    assert rep.bar.format_dict["rate"] is None
    assert "step/s" not in out.getvalue().replace("?step/s", "")  # tqdm shows "?step/s" until a rate exists
    rep.close(None)


def test_a_gang_restart_that_resumes_earlier_moves_the_bar_back() -> None:
    out = io.StringIO()
    rep = _Reporter("pets", True, out)
    rep.update({"phase": "Running", "totalEpochs": 3, "epoch": 1, "step": 300, "stepsTotal": 600})
    rep.update({"phase": "Running", "totalEpochs": 3, "epoch": 1, "step": 200, "stepsTotal": 600,
                "restarts": 1})
    assert (rep.bar.n, rep.bar.total) == (200, 600)
    rep.close(None)
