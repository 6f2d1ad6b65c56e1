"""Pods the Job controller is not allowed to create: their only trace is the Job's FailedCreate Events
(issue 21). The messages are the API server's own, as the Job controller records them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pets_operator import api, backends, builders, children, plan_types
from pets_operator import plan as planner
from pets_operator.plan_types import Observed, Round
from pets_operator.pods import SEVERITY, create_refused

pytestmark = pytest.mark.unit
NOW = datetime(2026, 11, 24, 10, 10, tzinfo=UTC)

POD = 'pods "pets-0-abcde" is forbidden: '
CASES = [
    (POD + "exceeded quota: tiny, requested: requests.cpu=500m, used: requests.cpu=0, "
     "limited: requests.cpu=200m",
     "ResourceQuota", "quota's usage drops"),
    (POD + 'violates PodSecurity "restricted:latest": restricted volume types (volume "data" uses restricted '
     'volume type "hostPath")', "Pod Security", "a person must"),
    (POD + 'error looking up service account default/nope: serviceaccount "nope" not found',
     "spec.serviceAccountName", "a person must"),
    (POD + "no PriorityClass with name nope was found", "spec.priorityClassName", "a person must"),
    (POD + "maximum cpu usage per Container is 500m, but limit is 900m", "LimitRange", "a person must"),
    ('admission webhook "deny.example.com" denied the request: trainings need a team label', "webhook",
     "a person must"),
    # the chart's trainer-pod policy, where the Job controller runs as a user it does not list
    (POD + "ValidatingAdmissionPolicy 'petstrainings.training.pets.dev-trainer-pods-ops-pets' with binding "
     "'petstrainings.training.pets.dev-trainer-pods-ops-pets' denied request: metadata.labels[training.pets"
     ".dev/training]: \"pets\" makes a pod a peer of that training (its NetworkPolicy admits it to the "
     "rendezvous): only the workload controllers may set it (chart value trainingNetworkPolicy.peerAdmission"
     ".creators: system:serviceaccount:kube-system:job-controller), not system:serviceaccount:kube-system:"
     "other; create a PetsTraining instead", "trainer-pod policy", "peerAdmission.creators"),
    (POD + "ValidatingAdmissionPolicy 'team-labels' with binding 'team-labels' denied request: no team",
     "ValidatingAdmissionPolicy", "a person must"),
]


def failed_create(message: str, count: int = 1, at: str = "2026-11-24T10:00:00Z") -> dict[str, object]:
    return {"type": "Warning", "reason": "FailedCreate", "message": f"Error creating: {message}",
            "count": count, "lastTimestamp": at, "involvedObject": {"kind": "Job", "name": "pets-0"}}


@pytest.mark.parametrize("message, what, todo", CASES)
def test_each_refusal_names_its_cause_whether_waiting_helps_and_the_servers_words(message: str, what: str,
                                                                                  todo: str) -> None:
    waiting = create_refused([failed_create(message, count=3)])
    assert waiting is not None and waiting.reason == "PodCreateRefused"
    assert waiting.message.startswith("3 pod create(s) refused: ")
    assert what in waiting.message and todo in waiting.message
    assert waiting.message.endswith("The API server said: " + message)


def test_only_quota_is_said_to_resolve_by_waiting() -> None:
    texts = [create_refused([failed_create(m)]).message for m, _, _ in CASES]  # type: ignore[union-attr]
    assert ["drops" in t for t in texts] == [True] + [False] * (len(CASES) - 1)


def test_the_newest_refusal_is_shown_and_every_refused_create_is_counted() -> None:
    events = [failed_create(CASES[0][0], count=4, at="2026-11-24T10:00:00Z"),
              failed_create(CASES[2][0], count=2, at="2026-11-24T10:05:00Z"),
              {"type": "Normal", "reason": "SuccessfulCreate", "message": "Created pod: pets-0-x",
               "count": 1}]
    waiting = create_refused(events)
    assert waiting is not None and "spec.serviceAccountName" in waiting.message
    assert waiting.message.startswith("6 pod create(s) refused")


def test_no_failed_create_means_no_refusal_and_a_refusal_is_the_worst_wait() -> None:
    assert create_refused([]) is None
    assert create_refused([{"reason": "SuccessfulCreate", "message": "Created pod: x"}]) is None
    assert SEVERITY[0] == "PodCreateRefused"


# ------------------------------------------------------------------- through plan.plan

def _plan(pods_now: list[dict[str, object]], refusals: list[dict[str, object]],
          old: dict[str, object] | None = None) -> plan_types.Plan:
    spec = api.resolve_spec({"replicas": 2})
    target = builders.Target("pets", "ns")
    job = children.build_job(spec, target)
    job["metadata"]["annotations"][api.ANNOTATION_SPEC_DIGEST] = builders.spec_digest(spec)
    job["status"] = {}
    body = {"metadata": {"name": "pets", "namespace": "ns", "generation": 1, "uid": "u1"},
            "spec": {"replicas": 2}, "status": old or {}}
    observed = Observed(backend=backends.JOB, workload=job, pods=pods_now, workload_refusals=refusals,
                        service=backends.JOB.build_service(spec, target))
    return planner.plan(Round.of(body, spec, observed, target, NOW))


def test_status_says_pod_create_refused_with_the_server_message_and_one_event_per_new_reason() -> None:
    quota = failed_create(CASES[0][0], count=5)
    plan = _plan([], [quota])
    assert plan.status.phase == api.PENDING
    progressing = next(c for c in plan.status.conditions if c["type"] == "Progressing")
    assert progressing["reason"] == "PodCreateRefused"
    assert plan.status.message.startswith("2/2 pod(s) waiting: 5 pod create(s) refused: a ResourceQuota")
    assert "exceeded quota: tiny" in plan.status.message
    assert [e.reason for e in plan.events] == ["PodCreateRefused"]
    again = _plan([], [quota], old=plan.status.to_dict())
    assert again.status.message == plan.status.message and again.events == []


def test_refusals_are_not_read_into_status_once_every_pod_exists() -> None:
    plan = _plan([{"metadata": {"name": f"pets-0-{i}", "labels": {}}, "status": {"phase": "Pending"}}
                  for i in range(2)], [failed_create(CASES[0][0])])
    progressing = next(c for c in plan.status.conditions if c["type"] == "Progressing")
    assert progressing["reason"] != "PodCreateRefused"
