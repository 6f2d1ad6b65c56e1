"""Children the API server refuses: permanent or not (cluster.child_refusal_permanent), what the
training then shows (refusals.child_refused), and what a round does with it (reconcile.plan_and_act)."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from operator_specs import condition, round_of, training  # tests/unit/operator/operator_specs.py
from pets_operator import act, api, backends, builders, context, pacing, plan_types, reconcile, refusals
from pets_operator import plan as planner
from pets_operator.children import build_service
from pets_operator.cluster import child_refusal_permanent
from pets_operator.plan_types import Round
from pets_operator.status_types import Status

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
VAP = ('jobs.batch "pets-r0" is forbidden: ValidatingAdmissionPolicy \'no-jobs\' with binding \'no-jobs\' '
       "denied request: spec.template.metadata.labels: a team label is required")


def refusal(code: int | None, message: str = "", reason: str = "") -> ApiException:
    exc = ApiException(status=code, reason=reason)
    exc.body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": code})
    return exc


@pytest.mark.parametrize(("code", "message", "permanent"), [
    (422, 'Job.batch "pets-r0" is invalid: spec.template.spec.containers[0].resources.limits[memory]: '
          "Invalid value: \"-4Gi\": must be greater than or equal to 0", True),
    (400, "the object provided is unrecognized", True),
    (413, "Request entity too large", True),
    (403, VAP, True),
    (403, 'admission webhook "deny.example.com" denied the request: no GPUs on Fridays', True),
    (403, 'jobs.batch "pets-r0" is forbidden: maximum memory usage per Container is 1Gi, but limit is '
          "3Gi", True),
    (403, 'jobs.batch "pets-r0" is forbidden: exceeded quota: jobs, requested: count/jobs.batch=1, '
          "used: count/jobs.batch=0, limited: count/jobs.batch=0", False),
    (403, 'jobs.batch "pets-r0" is forbidden: status unknown for quota: jobs, resource: '
          "count/jobs.batch", False),
    (403, 'jobs.batch is forbidden: User "system:serviceaccount:ops:pets" cannot create resource "jobs" in '
          'API group "batch" in the namespace "ml"', False),
    (403, 'jobs.batch "pets-r0" is forbidden: unable to create new content in namespace ml because it is '
          "being terminated", False),
    (409, "Operation cannot be fulfilled", False),
    (429, "Too many requests", False),
    (500, "Internal error", False),
    (503, "etcdserver: leader changed", False),
    (404, 'namespaces "ml" not found', False),
    (None, "", False),
])
def test_classification(code: int | None, message: str, permanent: bool) -> None:
    assert child_refusal_permanent(refusal(code, message)) is permanent


def test_classification_reads_a_body_that_is_not_json() -> None:
    exc = ApiException(status=403, reason="Forbidden")
    exc.body = "exceeded quota: jobs"
    assert child_refusal_permanent(exc) is False


def service_manifest() -> dict[str, Any]:
    return build_service(api.resolve_spec({}), builders.Target("pets", "ns"))


def child_refused(body: dict[str, Any], error: str, now: datetime, permanent: bool, child: str = "a child",
                  made: list[dict[str, Any]] | None = None, delete: list[dict[str, Any]] | None = None
                  ) -> plan_types.Plan:
    """refusals.child_refused, for a round of `body` in which the API server refused `child` after the
    round made `made`; `delete`: what the round's Plan meant to delete."""
    refused = plan_types.Refused(child, error, permanent, tuple(made or ()))
    r = Round.of(body, api.resolve_spec(body.get("spec") or {}), plan_types.Observed(backends.JOB, None),
                 builders.Target("pets", "ns"), now, refused=refused)
    return refusals.child_refused(r, plan_types.Plan(status=Status(), delete=delete or []))


def test_permanent_refusal_fails_with_the_servers_words_and_cleans_up() -> None:
    svc = service_manifest()
    pending = training({"phase": api.PENDING, "pendingSince": "2026-01-02T03:00:00Z"})
    p = child_refused(pending, VAP, NOW, True, child="Job pets-r0", made=[svc])
    assert p.status.phase == api.FAILED
    assert VAP in p.status.message and "Job pets-r0" in p.status.message
    assert condition(p, "Failed")["reason"] == "ChildRejected" and condition(p, "Failed")["status"] == "True"
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "ChildRejected")]
    assert p.delete == [{"apiVersion": "v1", "kind": "Service", "name": svc["metadata"]["name"],
                         "namespace": "ns"}]
    assert p.create == [] and p.requeue_after is None
    assert p.status.completion_time == "2026-01-02T03:04:05Z" and p.status.pending_since is None
    # Said once: the same refusal seen again emits no second Event.
    again = child_refused(training(p.status.to_dict()), VAP, NOW + timedelta(seconds=5), True,
                          child="Job pets-r0")
    assert again.events == [] and again.status.phase == api.FAILED


QUOTA = ('jobs.batch "pets-r0" is forbidden: exceeded quota: jobs, requested: count/jobs.batch=1, '
         "used: count/jobs.batch=0, limited: count/jobs.batch=0")


def test_transient_refusal_waits_pending_with_the_reason_and_backs_off() -> None:
    first = child_refused(training({"phase": api.PENDING}), QUOTA, NOW, False, child="Job pets-r0",
                          made=[service_manifest()])
    assert first.status.phase == api.PENDING and first.delete == []
    assert condition(first, "Progressing")["reason"] == "ChildCreateRetrying"
    assert QUOTA in first.status.message and "pets-r0" in first.status.message
    assert first.status.pending_since == "2026-01-02T03:04:05Z"
    assert [(e.type, e.reason) for e in first.events] == [("Warning", "ChildCreateRetrying")]
    delays = [first.requeue_after]
    st = first.status.to_dict()
    for waited in (2, 4, 8, 16, 32, 64, 600):
        p = child_refused(training(st), QUOTA, NOW + timedelta(seconds=waited), False, child="Job pets-r0")
        assert p.events == [] and p.status.pending_since == "2026-01-02T03:04:05Z"
        delays.append(p.requeue_after)
        st = p.status.to_dict()
    assert delays == [2.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_transient_refusal_during_a_restart_stays_restarting_and_workload_is_not_active() -> None:
    restarting = training({"phase": api.RESTARTING, "restarts": 1, "workloadActive": True})
    p = child_refused(restarting, QUOTA, NOW, False)
    assert p.status.phase == api.RESTARTING and p.status.workload_active is False


def test_pending_timeout_bounds_a_transient_refusal() -> None:
    spec = {"scheduling": {"pendingTimeoutSeconds": 60}}
    st = {"phase": api.PENDING, "pendingSince": "2026-01-02T03:03:35Z"}  # 30 s ago
    waiting = child_refused(training(st, **spec), QUOTA, NOW, False, child="Job pets-r0")
    assert waiting.status.phase == api.PENDING and waiting.requeue_after == 30.0
    later = child_refused(training(st, **spec), QUOTA, NOW + timedelta(seconds=25), False,
                          child="Job pets-r0")
    assert later.requeue_after == 5.0  # never sleeps past the deadline
    over = child_refused(training(st, **spec), QUOTA, NOW + timedelta(seconds=31), False, child="Job pets-r0",
                         made=[service_manifest()])
    assert over.status.phase == api.FAILED and condition(over, "Failed")["reason"] == "PendingTimeout"
    assert "pendingTimeoutSeconds=60" in over.status.message and QUOTA in over.status.message
    assert [d["kind"] for d in over.delete] == ["Service"]


# ----------------------------------------------------------------------------- the adapter


def apply_merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386's application, for the fake API server below."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            out[key] = apply_merge_patch(out.get(key) if isinstance(out.get(key), dict) else {}, value)
        else:
            out[key] = value
    return out


class FakeCluster:
    """Cluster's calls that _carry_out makes; create refuses the kinds in `refuse`."""

    namespace, name = "ns", "pets"
    key = (namespace, name)

    def __init__(self, refuse: dict[str, ApiException]):
        self.refuse = refuse
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.statuses: list[dict[str, Any]] = []
        self.stored: dict[str, Any] = {}  # the status the API server has

    def create(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        if manifest["kind"] in self.refuse:
            raise self.refuse[manifest["kind"]]
        self.created.append(f"{manifest['kind']}/{manifest['metadata']['name']}")
        return manifest

    def patch_status(self, patch: dict[str, Any]) -> dict[str, Any]:
        """As the API server does: the merge patch applied to the stored status (kept in `statuses`)."""
        st = self.stored = apply_merge_patch(self.stored, patch)
        self.statuses.append(st)
        return {"metadata": {"name": self.name, "namespace": self.namespace}, "status": st}

    def delete(self, ref: dict[str, Any]) -> bool:
        self.deleted.append(f"{ref['kind']}/{ref['name']}")
        return True


@pytest.fixture()
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    posted: list[tuple[str, str, str]] = []
    monkeypatch.setattr(act.kopf, "event",
                        lambda _body, *, type, reason, message: posted.append((type, reason, message)))
    return posted


def round_creating_both(old: dict[str, Any] | None = None, **observed: Any) -> tuple[dict[str, Any], Round]:
    """A new training's round: it makes the Service, the NetworkPolicy, the claim and the Job."""
    b = training(old)
    obs = plan_types.Observed(backend=backends.JOB, workload=None, **observed)
    return b, Round.of(b, api.resolve_spec({}), obs, builders.Target("pets", "ns"), NOW)


def plan_and_act(cl: FakeCluster, b: dict[str, Any], r: Round) -> float | None:
    """What reconcile does with the round: plan, carry out, and plan again for a refused child."""
    return reconcile.plan_and_act(context.Context(api_client=None), cl, b, r,  # type: ignore[arg-type]
                                  logging.getLogger("test"))


def test_carry_out_fails_the_training_and_deletes_the_service_it_made(
        events: list[tuple[str, str, str]]) -> None:
    b, r = round_creating_both()
    made = ["Service", "NetworkPolicy", "PersistentVolumeClaim", "Job"]
    assert [m["kind"] for m in planner.plan(r).create] == made
    cl = FakeCluster({"Job": refusal(403, VAP)})
    delay = plan_and_act(cl, b, r)
    assert cl.created == ["Service/pets", "NetworkPolicy/pets", "PersistentVolumeClaim/pets-output"]
    # the claim goes with the training (its owner reference); the policy is not named in status, so a
    # later attempt makes it again
    assert cl.deleted == ["Service/pets", "NetworkPolicy/pets"]
    assert "networkPolicy" not in cl.statuses[-1].get("children", {})
    assert cl.statuses[-1]["phase"] == api.FAILED and VAP in cl.statuses[-1]["message"]
    assert [(t, r) for t, r, _ in events] == [("Warning", "ChildRejected")]
    assert delay is None  # Failed: nothing to look at again (a new spec wakes it)


def test_carry_out_waits_on_a_quota_and_keeps_the_service(events: list[tuple[str, str, str]]) -> None:
    b, r = round_creating_both()
    cl = FakeCluster({"Job": refusal(403, QUOTA)})
    delay = plan_and_act(cl, b, r)
    assert cl.created == ["Service/pets", "NetworkPolicy/pets", "PersistentVolumeClaim/pets-output"]
    assert cl.deleted == [] and cl.statuses[-1]["phase"] == api.PENDING
    assert next(c for c in cl.statuses[-1]["conditions"] if c["type"] == "Progressing")["reason"] == \
        "ChildCreateRetrying"
    assert [(t, r) for t, r, _ in events] == [("Warning", "ChildCreateRetrying")]
    assert delay == refusals.CHILD_RETRY_MIN_SECONDS


def test_a_quota_that_refuses_the_output_claim_says_the_work_is_not_durable(
        events: list[tuple[str, str, str]]) -> None:
    """The claim is refused (a storage quota): the training waits and retries, and OutputDurable says why
    within that round; no workload is made that would mount a claim that is not there."""
    b, r = round_creating_both()
    quota = ('persistentvolumeclaims "pets-output" is forbidden: exceeded quota: storage, requested: '
             'requests.storage=5Gi, used: requests.storage=8Gi, limited: requests.storage=10Gi')
    cl = FakeCluster({"PersistentVolumeClaim": refusal(403, quota)})
    delay = plan_and_act(cl, b, r)
    assert cl.created == ["Service/pets", "NetworkPolicy/pets"] and cl.deleted == []
    written = cl.statuses[-1]
    assert written["phase"] == api.PENDING and "waiting to create PersistentVolumeClaim pets-output" in \
        written["message"]
    durable = next(c for c in written["conditions"] if c["type"] == "OutputDurable")
    assert (durable["status"], durable["reason"]) == ("False", "ClaimRefused")
    assert "pets-output" in durable["message"] and "exceeded quota: storage" in durable["message"]
    assert delay == refusals.CHILD_RETRY_MIN_SECONDS


def test_carry_out_cleans_up_a_service_made_by_an_earlier_round(events: list[tuple[str, str, str]]) -> None:
    """Round 1 made the Service and the NetworkPolicy and waited on a quota; round 2's Job is refused for
    good."""
    b, r = round_creating_both({"children": {"networkPolicy": "pets"}}, service=service_manifest())
    cl = FakeCluster({"Job": refusal(422, 'Job.batch "pets-r0" is invalid: spec.template: bad')})
    plan_and_act(cl, b, r)
    assert cl.created == ["PersistentVolumeClaim/pets-output"] and cl.deleted == ["Service/pets"]
    assert cl.statuses[-1]["phase"] == api.FAILED


def test_carry_out_lets_other_errors_through(events: list[tuple[str, str, str]]) -> None:
    b, r = round_creating_both()

    class Broken(FakeCluster):
        def create(self, manifest: dict[str, Any]) -> bool:
            raise ValueError("no API known")

    with pytest.raises(ValueError):
        plan_and_act(Broken({}), b, r)


def test_a_permanent_refusal_still_deletes_what_the_plan_meant_to_delete() -> None:
    meant = {"apiVersion": "batch/v1", "kind": "Job", "name": "pets-r0", "namespace": "ns"}
    p = child_refused(training(), "invalid", NOW, True, child="Job pets-r1", made=[service_manifest()],
                      delete=[meant])
    assert [(d["kind"], d["name"]) for d in p.delete] == [("Service", "pets"), ("Job", "pets-r0")]


def test_status_writes_within_a_phase_are_at_most_one_per_interval(
        events: list[tuple[str, str, str]]) -> None:
    """A burst of pod changes is one status write per STATUS_WRITE_INTERVAL; a phase change, or a Plan
    that acts on a child, is never held back; and a Plan held back does nothing."""
    stored = {"phase": api.PENDING, "message": "2/2 pod(s) waiting: waiting to be scheduled"}
    st = Status.from_dict(stored)
    creating = "containers are being created"

    def paced(p: plan_types.Plan, written_ago: float) -> plan_types.Plan:
        pacing.pace(replace(round_of(st), stored=stored, written_ago=written_ago), p)
        return p

    assert not paced(plan_types.Plan(status=replace(st, message=f"2/2 pod(s) waiting: {creating}")),
                     math.inf).hold  # the first write goes at once
    one_up = paced(plan_types.Plan(status=replace(st, message=f"1/2 pod(s) waiting: {creating}")), 1.0)
    assert one_up.hold and one_up.next_round == pacing.STATUS_WRITE_INTERVAL - 1.0
    running = plan_types.Plan(status=replace(st, phase=api.RUNNING, message="2/2 pods running"))
    assert not paced(running, 1.0).hold  # a phase change: at once
    assert not paced(plan_types.Plan(status=replace(st, message="x"), create=[service_manifest()]), 1.0).hold
    cl = FakeCluster({})
    act.carry_out(context.Context(api_client=None), cl, training(stored), one_up,  # type: ignore[arg-type]
                  logging.getLogger("test"))
    assert cl.statuses == [] and cl.created == [] and events == []
