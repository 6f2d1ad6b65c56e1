"""The chaos run's rules (tests/e2e/chaos.py), apart from the cluster: a seed draws one schedule, and the
verdict catches each broken promise the issue lists."""

from __future__ import annotations

from typing import Any

import pytest
from e2e import chaos  # tests/ is on sys.path (pyproject); tests/e2e is a namespace package

pytestmark = pytest.mark.unit

SHORT = chaos.MODES["short"]


def test_a_seed_draws_one_schedule_with_every_fault_and_the_operator_killed_every_20_to_40_s() -> None:
    plan = chaos.schedule(3, SHORT)
    assert plan == chaos.schedule(3, SHORT) != chaos.schedule(4, SHORT)
    kinds = [f.kind for f in plan]
    for kind in (chaos.APISERVER, chaos.ETCD, chaos.POD, chaos.NODE):
        assert kinds.count(kind) == 1, kinds
    assert kinds.count(chaos.EDIT) == 2
    kills = [f.at for f in plan if f.kind == chaos.OPERATOR]
    assert 20 <= kills[0] <= 40 and all(20 <= b - a <= 40 for a, b in zip(kills, kills[1:], strict=False))
    assert kills[-1] < SHORT.duration_s
    once = sorted(f.at for f in plan if f.kind != chaos.OPERATOR)
    assert all(b - a >= 15 for a, b in zip(once, once[1:], strict=False)), once
    assert [f.node_down_s for f in plan if f.kind == chaos.NODE] == [SHORT.node_down_s]


def done(restarts: int = 0, attempt: int | None = None, phase: str = "Succeeded") -> dict[str, Any]:
    return {"phase": phase, "restarts": restarts, "disruptions": restarts,
            "attempt": restarts if attempt is None else attempt,
            "goodput": {"lostSeconds": 2.5, "attempts": [{"lostSteps": 3}, {}]}}


def test_a_run_that_kept_every_promise_has_nothing_broken_and_adds_up_its_figures() -> None:
    log = [chaos.Injected(30, chaos.OPERATOR, "op-1"), chaos.Injected(50, chaos.NODE, "w1", ("a", "b")),
           chaos.Injected(70, chaos.POD, "a-0", ("a",)), chaos.Injected(80, chaos.ETCD, "etcd")]
    statuses = {"a": done(2), "b": done(1), "c": done(0)}
    jobs = {("a", "0"): {"u1"}, ("a", "1"): {"u2"}, ("a", "2"): {"u3"}, ("b", "0"): {"u4"},
            ("b", "1"): {"u5"}, ("c", "0"): {"u6"}}
    # attempt 1 is named while its step is still attempt 0's last (9), then resumes at 7
    samples = {"a": [chaos.Sample(t, attempt, step) for t, (attempt, step) in enumerate(
        [(0, 5), (0, 9), (1, 9), (1, 7), (1, 8), (2, 7)])]}
    out = chaos.judge(statuses, {"a": {"maxRestarts": 3}}, log, {"a": 3}, jobs, samples)
    assert out.broken == []
    assert out.figures["faults"][chaos.NODE] == 1 and out.figures["faults"][chaos.OPERATOR] == 1
    assert (out.figures["succeeded"], out.figures["extra_attempts"]) == (3, 3)
    assert (out.figures["lost_seconds"], out.figures["lost_steps"]) == (7.5, 9)


def test_each_broken_promise_is_named() -> None:
    log = [chaos.Injected(50, chaos.POD, "a-0", ("a",)), chaos.Injected(60, chaos.OPERATOR, "op")]
    statuses = {"a": done(1), "b": done(1), "c": done(0, phase="Failed")}
    jobs = {("a", "0"): {"u1"}, ("a", "1"): {"u2", "u3"}, ("b", "1"): {"u4"}, ("c", "0"): {"u5"}}
    samples = {"a": [chaos.Sample(1, 0, 5), chaos.Sample(2, 0, 4)],
               "b": [chaos.Sample(t, attempt, step) for t, (attempt, step) in enumerate(
                   [(0, 3), (1, 3), (1, 2), (1, 4), (1, 3)])]}
    out = chaos.judge(statuses, {"a": {"maxRestarts": 1}}, log, {"a": 3}, jobs, samples)
    text = "\n".join(out.broken)
    assert "b: restarts 1, disruptions 1; the faults that hit it owe 0" in text  # the operator's kill cost it
    assert "a: attempt 1 had 2 Jobs" in text and "b: attempt 0 had 0 Jobs" in text
    assert "c: Failed" in text
    assert "a: spec.maxRestarts was edited to 3 mid-run, and is 1" in text
    assert "a: step 5 -> 4 within attempt 0" in text
    assert "b: step 4 -> 3 within attempt 1" in text and "b: step 3 -> 2" not in text
    assert out.figures["broken"] == len(out.broken) == 7
