"""spec.placement (spread over nodes, lost-node tolerations) and pods on lost nodes: builders, the planner,
and the thin adapter around them (which Node it reads, what it force-deletes)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from operator_specs import TARGET, env_of, spec  # tests/unit/operator/operator_specs.py
from pets_operator import api, backends, builders, children, cluster, observe, plan_types, pods
from pets_operator import plan as planner
from pets_operator.plan_types import Round

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
LOST_TAINTS = {"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"}


def templates(workload: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod template of a Job or a PyTorchJob."""
    if workload["kind"] == "Job":
        return [workload["spec"]["template"]]
    return [r["template"] for r in workload["spec"]["pytorchReplicaSpecs"].values()]


def ours(tolerations: list[dict[str, Any]]) -> dict[str, int]:
    return {t["key"]: t["tolerationSeconds"] for t in tolerations
            if t.get("key") in LOST_TAINTS and "tolerationSeconds" in t and t.get("operator") == "Exists"}


# ----------------------------------------------------------------------------- builders


@pytest.mark.parametrize("backend", [backends.JOB, backends.PYTORCHJOB], ids=lambda b: b.name)
def test_default_placement_tolerates_a_lost_node_for_30_seconds_and_does_not_spread(
        backend: backends.Backend) -> None:
    for template in templates(backend.build_workload(spec(), TARGET)):
        pod = template["spec"]
        assert pod["tolerations"] == [
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 30},
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 30},
        ]
        assert "topologySpreadConstraints" not in pod


@pytest.mark.parametrize("backend", [backends.JOB, backends.PYTORCHJOB], ids=lambda b: b.name)
def test_spread_across_nodes_selects_exactly_this_attempts_trainer_pods(backend: backends.Backend) -> None:
    target = builders.Target("pets", "team-a", attempt=2)
    s = spec(placement={"spreadAcrossNodes": True, "nodeLostSeconds": 5})
    for template in templates(backend.build_workload(s, target)):
        (constraint,) = template["spec"]["topologySpreadConstraints"]
        assert constraint == {
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {api.LABEL_TRAINING: "pets", api.LABEL_COMPONENT: "trainer",
                                              api.LABEL_ATTEMPT: "2"}},
            "nodeTaintsPolicy": "Honor", "nodeAffinityPolicy": "Honor",
        }
        labels = template["metadata"]["labels"]
        assert constraint["labelSelector"]["matchLabels"].items() <= labels.items()
        assert ours(template["spec"]["tolerations"]) == dict.fromkeys(LOST_TAINTS, 5)
    # The previous attempt's pods carry another attempt label: they never skew the new attempt's spread.
    older = children.build_job(s, builders.Target("pets", "team-a", attempt=1))["spec"]["template"]
    assert older["metadata"]["labels"][api.LABEL_ATTEMPT] == "1"


@pytest.mark.parametrize(("user", "added"), [
    # The user's NoExecute toleration of a key wins; the other key still gets ours.
    ({"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
      "tolerationSeconds": 600}, {"node.kubernetes.io/not-ready"}),
    # No effect: it tolerates every effect of that key, NoExecute included.
    ({"key": "node.kubernetes.io/not-ready", "operator": "Exists"}, {"node.kubernetes.io/unreachable"}),
    # A key-less Exists tolerates every taint: the user chose to stay forever.
    ({"operator": "Exists"}, set()),
    # NoSchedule says nothing about eviction: ours are added.
    ({"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoSchedule"}, LOST_TAINTS),
    ({"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}, LOST_TAINTS),
])
def test_a_users_toleration_of_the_same_key_wins(user: dict[str, Any], added: set[str]) -> None:
    template = children.build_job(spec(tolerations=[user]), TARGET)["spec"]["template"]
    tolerations = template["spec"]["tolerations"]
    assert tolerations[0] == user
    assert [t["key"] for t in tolerations[1:]] == [k for k in builders.NODE_LOST_TAINTS if k in added]
    assert all(t["tolerationSeconds"] == 30 and t["effect"] == "NoExecute" for t in tolerations[1:])


def test_node_lost_seconds_zero_evicts_at_once() -> None:
    pod = children.build_job(spec(placement={"nodeLostSeconds": 0}), TARGET)["spec"]["template"]["spec"]
    assert ours(pod["tolerations"]) == dict.fromkeys(LOST_TAINTS, 0)


@pytest.mark.parametrize("backend", [backends.JOB, backends.PYTORCHJOB], ids=lambda b: b.name)
def test_the_attempt_is_in_the_trainers_environment(backend: backends.Backend) -> None:
    workload = backend.build_workload(spec(), builders.Target("pets", "team-a", attempt=3))
    for template in templates(workload):
        assert env_of(template["spec"]["containers"][0])["PETS_ATTEMPT"] == "3"


def test_pets_attempt_is_reserved() -> None:
    with pytest.raises(api.SpecError, match=r"spec\.env\[0\]\.name.*must not start with PETS_"):
        api.resolve_spec({"env": [{"name": "PETS_ATTEMPT", "value": "9"}]})


@pytest.mark.parametrize(("placement", "words"), [
    ({"nodeLostSeconds": 3601}, "spec.placement.nodeLostSeconds: 3601 is greater than the maximum of 3600"),
    ({"nodeLostSeconds": -1}, "spec.placement.nodeLostSeconds: -1 is less than the minimum of 0"),
    ({"spreadAcrossNodes": "yes"}, "spec.placement.spreadAcrossNodes: 'yes' is not of type 'boolean'"),
    ({"spread": True}, "spec.placement: Additional properties are not allowed ('spread' was unexpected)"),
])
def test_bad_placement_names_the_field_and_the_value(placement: dict[str, Any], words: str) -> None:
    with pytest.raises(api.SpecError) as err:
        api.resolve_spec({"placement": placement})
    assert str(err.value) == words


def test_placement_defaults_and_immutability() -> None:
    assert api.resolve_spec({}).placement == {"spreadAcrossNodes": False, "nodeLostSeconds": 30}
    assert "placement" not in api.MUTABLE_WHILE_RUNNING and "placement" in api.immutable_while_running()


def test_the_digest_covers_placement_but_not_its_default() -> None:
    plain = api.resolve_spec({})
    before_the_field = {k: v for k, v in plain.to_dict().items() if k != "placement"}
    # A workload built before spec.placement existed is not taken for one built from an edited spec...
    assert builders.spec_digest(plain) == builders.spec_digest(before_the_field)
    # ...but an edit of placement (while suspended) is: the workload is rebuilt with it.
    spread = api.resolve_spec({"placement": {"spreadAcrossNodes": True}})
    faster = api.resolve_spec({"placement": {"nodeLostSeconds": 10}})
    assert len({builders.spec_digest(s) for s in (plain, spread, faster)}) == 3


# ----------------------------------------------------------------------------- pods

def node(ready: str | None) -> dict[str, Any]:
    conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    return {"metadata": {"name": "node-b"}, "status": {"conditions": conditions}}


def test_a_node_is_lost_when_unknown_or_gone_not_when_not_ready() -> None:
    assert pods.node_lost(node("Unknown")) == "Ready Unknown"
    assert pods.node_lost(None) is not None
    assert pods.node_lost(node("False")) is None  # a kubelet that reports NotReady is alive
    assert pods.node_lost(node("True")) is None
    assert pods.node_lost(node(None)) is None  # not reported yet: nothing says it is lost


def trainer_pod(index: int, *, job: str = "pets", deleting: bool = True, phase: str = "Running",
                node_name: str = "node-b") -> dict[str, Any]:
    labels = {"job-name": job, "batch.kubernetes.io/job-completion-index": str(index)}
    meta: dict[str, Any] = {"name": f"{job}-{index}-x", "uid": f"uid-{job}-{index}", "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-02T03:04:00Z"
    return {"metadata": meta, "spec": {"nodeName": node_name}, "status": {"phase": phase}}


def test_only_unfinished_pods_being_deleted_on_a_node_can_be_stuck() -> None:
    assert pods.terminating_unfinished(trainer_pod(0))
    assert not pods.terminating_unfinished(trainer_pod(0, deleting=False))
    assert not pods.terminating_unfinished(trainer_pod(0, phase="Failed"))
    assert not pods.terminating_unfinished(trainer_pod(0, phase="Succeeded"))
    assert not pods.terminating_unfinished(trainer_pod(0, node_name=""))


# ----------------------------------------------------------------------------- the planner


def body(st: dict[str, Any], **spec_fields: Any) -> dict[str, Any]:
    return {"metadata": {"name": "pets", "namespace": "ns", "generation": 1, "uid": "u1"},
            "spec": {"replicas": 2, **spec_fields}, "status": st}


def running_job(attempt: int = 0, **spec_fields: Any) -> dict[str, Any]:
    j = backends.JOB.build_workload(api.resolve_spec({"replicas": 2, **spec_fields}),
                                    builders.Target("pets", "ns", attempt))
    j["metadata"]["uid"] = f"job-uid-{attempt}"
    j["status"] = {"active": 2, "ready": 2, "startTime": "2026-01-02T03:00:00Z"}
    return j


def plan(b: dict[str, Any], workload: dict[str, Any] | None, pod_list: list[dict[str, Any]],
         **observed: Any) -> plan_types.Plan:
    s = api.resolve_spec(b["spec"])
    target = builders.Target("pets", "ns", int(b["status"].get("attempt", 0)))
    obs = plan_types.Observed(backend=backends.JOB, workload=workload, pods=pod_list,
                          service=backends.JOB.build_service(s, target), **observed)
    return planner.plan(Round.of(b, s, obs, target, NOW))


RUNNING = {"phase": api.RUNNING, "restarts": 3, "attempt": 3, "disruptions": 1,
           "lastCheckpoint": {"epoch": 4, "time": "2026-01-02T03:00:00Z"}}


def test_a_lost_pod_of_the_current_attempt_restarts_the_gang_uncounted_and_is_force_deleted() -> None:
    lost = trainer_pod(1, job="pets-r3")
    gang = [trainer_pod(0, job="pets-r3", deleting=False, node_name="node-a"), lost]
    # maxRestarts 2 is spent (3 restarts, 1 of them a disruption): a lost node still restarts.
    claim = {"persistentVolumeClaim": {"claimName": "out"}}
    p = plan(body(RUNNING, maxRestarts=2, output=claim), running_job(3, output=claim), gang,
             lost_pods=[lost], lost_nodes={"node-b": "Ready Unknown"})
    st = p.status.to_dict()
    assert st["phase"] == api.RESTARTING and st["message"].startswith("attempt 3 failed (node node-b stopped")
    assert st["restarts"] == 4 and st["disruptions"] == 2 and st["attempt"] == 4
    assert st["message"] == (
        "attempt 3 failed (node node-b stopped responding (Ready Unknown); its pod pets-r3-1-x (rank 1) was "
        "force-deleted); restarting the gang (not counted: the cluster ended the pod), resuming from the "
        "checkpoint of epoch 4")
    assert next(c for c in st["conditions"] if c["type"] == "Progressing")["reason"] == "GangRestart"
    assert st["lastFailure"] == {"cause": "NodeLost", "pod": "pets-r3-1-x", "rank": 1, "node": "node-b",
                                 "message": "node node-b stopped responding (Ready Unknown); its pod "
                                            "pets-r3-1-x (rank 1) was force-deleted",
                                 "time": "2026-01-02T03:04:05Z"}
    assert p.force_delete == [{"name": "pets-r3-1-x", "uid": "uid-pets-r3-1"}]
    assert [r["name"] for r in p.delete] == ["pets-r3"]
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "NodeLost"), ("Warning", "Restarting")]
    assert "node node-b" in p.events[0].message and "pets-r3-1-x" in p.events[0].message
    assert p.next_round == 0.5


def test_a_lost_pod_of_a_failed_attempt_is_the_cause_not_its_peers_exit() -> None:
    lost = trainer_pod(1, job="pets-r3")
    peer = {**trainer_pod(0, job="pets-r3", deleting=False, node_name="node-a", phase="Failed")}
    peer["status"]["containerStatuses"] = [{"name": "trainer", "state": {"terminated": {
        "exitCode": 1, "finishedAt": "2026-01-02T03:04:01Z"}}}]
    failed = running_job(3)
    failed["status"] = {"failed": 1, "conditions": [{"type": "Failed", "status": "True",
                                                    "reason": "BackoffLimitExceeded", "message": "x"}]}
    p = plan(body(RUNNING, maxRestarts=2), failed, [peer, lost], lost_pods=[lost],
             lost_nodes={"node-b": "Ready Unknown"})
    assert p.status.phase == api.RESTARTING and p.status.last_failure["cause"] == "NodeLost"
    assert p.status.disruptions == 2


def test_a_lost_pod_of_an_older_attempt_is_only_force_deleted() -> None:
    stale = running_job(2)
    stale["metadata"]["deletionTimestamp"] = "2026-01-02T03:04:00Z"
    lost = trainer_pod(0, job="pets-r2")
    st = {**RUNNING, "phase": api.RESTARTING}
    p = plan(body(st), None, [], stale=[stale], lost_pods=[lost], lost_nodes={"node-b": "Ready Unknown"})
    assert p.status.phase == api.RESTARTING and p.status.restarts == 3
    assert p.status.message == "waiting for the previous attempt's workload to go away"
    assert p.force_delete == [{"name": "pets-r2-0-x", "uid": "uid-pets-r2-0"}] and p.create == []
    assert [e.reason for e in p.events] == ["NodeLost"]
    # The same once the new attempt runs: its own pods are fine, nothing restarts.
    ok = [trainer_pod(i, job="pets-r3", deleting=False) for i in range(2)]
    p = plan(body(RUNNING), running_job(3), ok, stale=[stale], lost_pods=[lost],
             lost_nodes={"node-b": "Ready Unknown"})
    assert p.status.phase == api.RUNNING and p.status.restarts == 3
    assert [f["name"] for f in p.force_delete] == ["pets-r2-0-x"]


def test_no_lost_pod_no_action() -> None:
    gang = [trainer_pod(i, job="pets-r3", deleting=False) for i in range(2)]
    p = plan(body(RUNNING), running_job(3), gang)
    assert p.status.phase == api.RUNNING and p.force_delete == [] and p.delete == []


def test_a_suspended_workloads_lost_pod_is_force_deleted_without_a_restart() -> None:
    suspended = running_job(3)
    suspended["spec"]["suspend"] = True
    suspended["status"] = {}
    lost = trainer_pod(0, job="pets-r3")
    p = plan(body({**RUNNING, "phase": api.SUSPENDED}, suspend=True), suspended, [lost], lost_pods=[lost],
             lost_nodes={"node-b": "Ready Unknown"})
    assert p.status.phase == api.SUSPENDED and p.status.restarts == 3
    assert [f["name"] for f in p.force_delete] == ["pets-r3-0-x"]


# ----------------------------------------------------------------------------- the adapter


class FakeCore:
    """The few CoreV1Api calls the lost-node path makes, counted."""

    def __init__(self, nodes: dict[str, dict[str, Any] | int]):
        self.nodes = nodes
        self.reads: list[str] = []
        self.deleted: list[tuple[str, int | None, str | None]] = []

    def read_node(self, name: str) -> dict[str, Any]:
        self.reads.append(name)
        found = self.nodes.get(name, 404)
        if isinstance(found, int):
            raise ApiException(status=found, reason="nope")
        return found

    def delete_namespaced_pod(self, name: str, namespace: str, grace_period_seconds: int | None = None,
                              body: Any = None) -> None:
        uid = body.preconditions.uid if body is not None and body.preconditions else None
        self.deleted.append((name, grace_period_seconds, uid))
        if name == "gone":
            raise ApiException(status=404, reason="NotFound")


def fake_cluster(core: FakeCore) -> cluster.Cluster:
    cl = cluster.Cluster.__new__(cluster.Cluster)
    cl.namespace, cl.name, cl._nodes = "ns", "pets", {}
    cl.core = core  # type: ignore[assignment]
    cl._dict = lambda obj: obj  # type: ignore[method-assign]
    return cl


def test_only_pods_being_deleted_make_the_operator_read_their_node_once_per_round() -> None:
    core = FakeCore({"node-a": node("True"), "node-b": node("Unknown"), "node-c": node("False")})
    current = [trainer_pod(0, deleting=False, node_name="node-x"),  # not deleting: no Node read
               trainer_pod(1, node_name="node-a"),  # Ready: its kubelet will finish it
               trainer_pod(2, node_name="node-b"), trainer_pod(3, node_name="node-b"),
               trainer_pod(4, node_name="node-c")]  # NotReady: its kubelet reports, not lost
    stale = [trainer_pod(0, job="pets-r2", node_name="node-gone")]
    lost, why = observe.lost_pods(fake_cluster(core), observe.lost_candidates(current + stale))
    assert [p["metadata"]["name"] for p in lost] == ["pets-2-x", "pets-3-x", "pets-r2-0-x"]
    assert why == {"node-b": "Ready Unknown", "node-gone": pods.node_lost(None)}
    assert sorted(core.reads) == ["node-a", "node-b", "node-c", "node-gone"]  # node-b once
    healthy = FakeCore({})
    assert observe.lost_pods(fake_cluster(healthy), observe.lost_candidates(
        [trainer_pod(i, deleting=False) for i in range(3)])) == ([], {})
    assert healthy.reads == []


def test_without_the_right_to_read_nodes_nothing_is_lost(caplog: pytest.LogCaptureFixture) -> None:
    cl = fake_cluster(FakeCore({"node-b": 403}))
    assert cl.node_lost("node-b") is None
    assert "cannot read Node node-b" in caplog.text and "rbac.nodes" in caplog.text


def test_force_delete_has_no_grace_and_only_that_pod() -> None:
    core = FakeCore({})
    cl = fake_cluster(core)
    cl.force_delete_pod("pets-1-x", "uid-1")
    cl.force_delete_pod("gone")  # already gone: fine
    assert core.deleted == [("pets-1-x", 0, "uid-1"), ("gone", 0, None)]
