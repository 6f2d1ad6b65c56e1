"""The pods wait for the claims the operator made, where their class binds Immediate (claim_binding)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from operator_specs import condition, training  # tests/unit/operator/operator_specs.py
from pets_operator import api, backends, builders, children, claim_binding, plan_types
from pets_operator import plan as planner
from pets_operator.plan_types import Round

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
TARGET = builders.Target("pets", "ns")


def storage_class(name: str, mode: str | None = None, default: bool = False) -> dict[str, Any]:
    annotations = {api.DEFAULT_STORAGE_CLASS_ANNOTATION: "true" if default else "false"}
    sc: dict[str, Any] = {"metadata": {"name": name, "annotations": annotations}, "provisioner": "x.example"}
    return sc | ({"volumeBindingMode": mode} if mode else {})


CLASSES = [storage_class("now", default=True), storage_class("later", "WaitForFirstConsumer"),
           storage_class("also-now", "Immediate")]


def output_claim(class_name: str | None = None, phase: str | None = None) -> dict[str, Any]:
    wanted = {"storageClassName": class_name} if class_name else {}
    spec = api.resolve_spec({"output": {"managedClaim": wanted}})
    claim = children.build_output_claim(spec, TARGET)
    assert claim is not None
    return claim | ({"status": {"phase": phase}} if phase else {})


def test_a_claim_not_bound_on_an_immediate_class_is_waited_for() -> None:
    made = output_claim()
    assert claim_binding._unbound_immediate([made], {"pets-output": None}, CLASSES) == {"pets-output": "now"}
    pending = made | {"status": {"phase": "Pending"},
                      "spec": {**made["spec"], "storageClassName": "also-now"}}
    # A made claim's class is the one the API server gave it, not the cluster's default of now.
    assert claim_binding._unbound_immediate([made], {"pets-output": pending}, CLASSES) == \
        {"pets-output": "also-now"}


@pytest.mark.parametrize("claim,found,classes", [
    (output_claim(), output_claim(phase="Bound"), CLASSES),  # bound
    (output_claim("later"), None, CLASSES),  # the scheduler binds it with the pods
    (output_claim(), None, None),  # the operator may not list StorageClasses: it cannot tell
    (output_claim(), None, [storage_class("later", "WaitForFirstConsumer", default=True)]),
    (output_claim(), None, [storage_class("now")]),  # no default class: the claim asks for none
    (output_claim("gone"), None, CLASSES),  # a class that is not there: the claim says so, not us
])
def test_nothing_waits_where_the_scheduler_would_not_turn_the_pods_away(
        claim: dict[str, Any], found: dict[str, Any] | None, classes: list[dict[str, Any]] | None) -> None:
    assert claim_binding._unbound_immediate([claim], {"pets-output": found}, classes) == {}


def test_a_claim_asking_for_no_class_binds_to_a_volume_made_for_it_and_is_not_waited_for() -> None:
    made = output_claim()
    made["spec"]["storageClassName"] = ""
    assert claim_binding._unbound_immediate([made], {"pets-output": None}, CLASSES) == {}


def plan(unbound: dict[str, str], old: dict[str, Any] | None = None, now_after: float = 0.0,
         target: builders.Target = TARGET, **spec: Any) -> plan_types.Plan:
    """A round that finds the claims `unbound` (by name, with their class) not made yet: the class binds
    Immediate."""
    spec = {"output": {"managedClaim": {}}} | spec
    classes = [storage_class(name, "Immediate", default=True) for name in set(unbound.values())]
    observed = plan_types.Observed(backend=backends.JOB, workload=None, claims=dict.fromkeys(unbound),
                                   storage_classes=classes or None)
    return planner.plan(Round.of(training(old, **spec), api.resolve_spec(spec), observed, target,
                       NOW + timedelta(seconds=now_after)))


def test_the_round_makes_the_claims_and_waits_to_make_the_job() -> None:
    p = plan({"pets-output": "now"})
    assert [m["kind"] for m in p.create] == ["Service", "NetworkPolicy", "PersistentVolumeClaim"]
    assert p.status.phase == api.PENDING and p.status.workload_active is False
    progressing = condition(p, "Progressing")
    assert progressing["reason"] == "WaitingForClaimBinding", progressing
    assert "pets-output (StorageClass now) to be bound" in progressing["message"]
    assert p.requeue_after == claim_binding.CLAIM_POLL_SECONDS
    assert "Created" not in [e.reason for e in p.events]
    bound = plan({}, p.status.to_dict())
    assert [m["kind"] for m in bound.create][-1] == "Job"
    assert "Created" in [e.reason for e in bound.events]


def test_a_dataset_cache_claim_is_waited_for_too() -> None:
    dataset = {"url": "https://example.com/pets.tar.gz"}
    cache = builders.dataset_cache_name(api.resolve_spec({"dataset": dataset}))
    p = plan({cache: "now"}, dataset=dataset, output={"emptyDir": {}})
    assert [m["kind"] for m in p.create] == ["Service", "NetworkPolicy", "PersistentVolumeClaim"]
    assert f"the claim {cache} (StorageClass now)" in condition(p, "Progressing")["message"]


def test_a_workload_made_suspended_does_not_wait() -> None:
    """Its pods come later (Kueue's admission, a resume), when the claim has long bound."""
    suspended = plan({"pets-output": "now"}, suspend=True)
    queued = plan({"pets-output": "now"}, target=builders.Target("pets", "ns", queue_labels={
        api.KUEUE_QUEUE_LABEL: "team-a"}))
    for p in (suspended, queued):
        assert [m["kind"] for m in p.create][-1] == "Job"


def test_the_wait_counts_against_the_pending_timeout() -> None:
    waiting, timeout = {"pets-output": "now"}, {"pendingTimeoutSeconds": 60}
    first = plan(waiting, scheduling=timeout)
    assert first.status.pending_since == "2026-01-02T03:04:05Z"
    assert first.requeue_after == claim_binding.CLAIM_POLL_SECONDS
    later = plan(waiting, first.status.to_dict(), 59.5, scheduling=timeout)
    assert later.requeue_after == pytest.approx(0.5)  # the timeout comes before the next look
    out = plan(waiting, later.status.to_dict(), 60, scheduling=timeout)
    assert out.status.phase == api.FAILED and out.create == []
    ready = condition(out, "Ready")
    assert ready["reason"] == "PendingTimeout", ready
    assert ready["message"].startswith("did not start within spec.scheduling.pendingTimeoutSeconds=60: "
                                       "waiting for the claim pets-output"), ready


def test_a_claim_that_does_not_bind_is_looked_at_less_and_less_often() -> None:
    assert [claim_binding._poll_after(w) for w in (0, 5, 10, 60, 300, 3600)] == [1, 1, 1, 6, 30, 30]
    first = plan({"pets-output": "now"})
    assert plan({"pets-output": "now"}, first.status.to_dict(), 120).requeue_after == 12
