"""The NetworkPolicy around a training's pods (spec.networkPolicy, the chart's trainingNetworkPolicy): the
builder, the planner that makes it once and deletes it when turned off, and the flags that configure it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from operator_specs import TARGET, spec  # tests/unit/operator/operator_specs.py
from pets_operator import api, backends, builders, children, cli, plan_types, render
from pets_operator import plan as planner
from pets_operator.plan_types import Round

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
OPERATOR = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "pets-system"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/component": "operator"}}}
PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return selector["matchLabels"].items() <= labels.items()


def trainer_pod_labels(backend: backends.Backend, target: builders.Target) -> list[dict[str, str]]:
    workload = backend.build_workload(spec(), target)
    if workload["kind"] == "Job":
        return [workload["spec"]["template"]["metadata"]["labels"]]
    return [r["template"]["metadata"]["labels"] for r in workload["spec"]["pytorchReplicaSpecs"].values()]


# ----------------------------------------------------------------------------- builder


def test_the_rendezvous_and_every_other_port_are_open_only_to_the_same_trainings_pods() -> None:
    settings = builders.NetworkPolicySettings(metrics_from=(OPERATOR, PROMETHEUS))
    target = builders.Target("pets", "team-a", network_policy=settings)
    policy = children.build_network_policy(spec(), target)
    assert policy is not None
    assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    assert policy["metadata"]["name"] == "pets" and policy["metadata"]["namespace"] == "team-a"
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open: data and weights sources vary
    same_training, progress = policy["spec"]["ingress"]
    # No ports: gloo's and NCCL's collectives listen on ports of their own choosing, beside masterPort.
    assert same_training == {"from": [{"podSelector": policy["spec"]["podSelector"]}]}
    assert progress == {"ports": [{"protocol": "TCP", "port": api.METRICS_PORT}],
                        "from": [OPERATOR, PROMETHEUS]}


@pytest.mark.parametrize("backend", [backends.JOB, backends.PYTORCHJOB], ids=lambda b: b.name)
def test_the_policy_selects_its_own_trainers_of_every_attempt_and_no_other_trainings(
        backend: backends.Backend) -> None:
    policy = children.build_network_policy(spec(), TARGET)
    assert policy is not None
    selector = policy["spec"]["podSelector"]
    for attempt in (0, 3):
        for labels in trainer_pod_labels(backend, builders.Target("pets", "team-a", attempt)):
            assert matches(selector, labels)
    for labels in trainer_pod_labels(backend, builders.Target("other", "team-a")):
        assert not matches(selector, labels)
    # The Service is not a pod of the training, and the policy's own label names what it is.
    assert policy["metadata"]["labels"][api.LABEL_COMPONENT] == "network-policy"


def test_without_named_peers_the_progress_port_is_open_to_every_source() -> None:
    """An operator run outside the cluster (pets-operator run on a laptop) reads the port from a node
    address, which no pod selector names."""
    policy = children.build_network_policy(spec(), TARGET)
    assert policy is not None
    assert policy["spec"]["ingress"][1] == {"ports": [{"protocol": "TCP", "port": api.METRICS_PORT}]}


def test_spec_or_operator_switch_off_means_no_policy() -> None:
    assert children.build_network_policy(spec(networkPolicy=False), TARGET) is None
    off = builders.Target("pets", "team-a", network_policy=builders.NetworkPolicySettings(enabled=False))
    assert children.build_network_policy(spec(), off) is None


def test_the_default_leaves_the_workload_digest_of_running_trainings_alone() -> None:
    """An operator upgrade that adds spec.networkPolicy (default true) must not take every running
    workload for an edited one; setting it false is an edit."""
    before_the_field = {k: v for k, v in spec().to_dict().items() if k != "networkPolicy"}
    assert builders.spec_digest(spec()) == builders.spec_digest(before_the_field)
    assert builders.spec_digest(spec(networkPolicy=False)) != builders.spec_digest(spec())


def test_render_prints_the_policy_before_the_workload() -> None:
    obj = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "pets"}, "spec": {}}
    kinds = [m["kind"] for m in render.render_object(obj)]
    assert kinds.index("NetworkPolicy") < kinds.index("Job")
    off = {**obj, "spec": {"networkPolicy": False}}
    assert "NetworkPolicy" not in [m["kind"] for m in render.render_object(off)]


# ----------------------------------------------------------------------------- planner


def body(st: dict[str, Any] | None = None, **spec_fields: Any) -> dict[str, Any]:
    return {"metadata": {"name": "pets", "namespace": "ns", "generation": 1, "uid": "u1"},
            "spec": spec_fields, "status": st or {}}


def plan(b: dict[str, Any], workload: dict[str, Any] | None = None,
         settings: builders.NetworkPolicySettings | None = None) -> plan_types.Plan:
    s = api.resolve_spec(b["spec"])
    target = builders.Target("pets", "ns", network_policy=settings or builders.NetworkPolicySettings())
    if workload is not None:
        workload["metadata"]["annotations"][api.ANNOTATION_SPEC_DIGEST] = builders.spec_digest(s)
    observed = plan_types.Observed(backend=backends.JOB, workload=workload,
                               service=backends.JOB.build_service(s, target) if workload else None)
    return planner.plan(Round.of(b, s, observed, target, NOW))


def running_job(s: dict[str, Any]) -> dict[str, Any]:
    job = children.build_job(api.resolve_spec(s), builders.Target("pets", "ns"))
    job["status"] = {"active": 2, "ready": 2, "startTime": "2026-01-02T03:00:00Z"}
    return job


def test_made_once_before_the_first_pods_and_named_in_status() -> None:
    first = plan(body())
    kinds = [m["kind"] for m in first.create]
    assert kinds[:2] == ["Service", "NetworkPolicy"] and kinds[-1] == "Job"
    assert first.status.children["networkPolicy"] == "pets"
    later = plan(body(first.status.to_dict()), running_job({}))
    assert "NetworkPolicy" not in [m["kind"] for m in later.create]
    assert later.status.children["networkPolicy"] == "pets" and later.delete == []


def test_a_training_started_by_an_operator_without_policies_gets_one_while_it_runs() -> None:
    p = plan(body({"phase": api.RUNNING, "children": {"job": "pets", "service": "pets"}}), running_job({}))
    assert [m["kind"] for m in p.create] == ["NetworkPolicy"]
    assert p.status.children["networkPolicy"] == "pets"


def test_turned_off_the_policy_it_made_is_deleted_and_no_other() -> None:
    made = {"phase": api.SUSPENDED, "children": {"job": "pets", "service": "pets", "networkPolicy": "pets"}}
    p = plan(body(made, networkPolicy=False, suspend=True), None)
    assert {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "name": "pets",
            "namespace": "ns"} in p.delete
    assert "networkPolicy" not in p.status.children
    # written as a merge patch that nulls it (a patch that only omitted it would keep the stored name)
    assert plan_types.merge_patch(made, p.status.to_dict())["children"]["networkPolicy"] is None
    assert "NetworkPolicy" not in [m["kind"] for m in p.create]
    # One the operator did not make (not in status.children) is not touched.
    never_made = plan(body({"phase": api.SUSPENDED}, networkPolicy=False, suspend=True), None)
    assert not [r for r in never_made.delete if r["kind"] == "NetworkPolicy"]
    off = plan(body(made), running_job({}), builders.NetworkPolicySettings(enabled=False))
    assert [r["name"] for r in off.delete if r["kind"] == "NetworkPolicy"] == ["pets"]


def test_a_finished_training_keeps_its_policy_in_status() -> None:
    done = {"phase": api.SUCCEEDED, "children": {"job": "pets", "service": "pets", "networkPolicy": "pets"}}
    p = plan(body(done), running_job({}))
    assert p.status.children["networkPolicy"] == "pets" and p.create == []


# ----------------------------------------------------------------------------- flags


def test_run_flags_configure_the_policy() -> None:
    defaults = cli.build_parser().parse_args(["run"])
    assert defaults.training_network_policy == "on" and defaults.metrics_from == ()
    peers = '[{"ipBlock": {"cidr": "10.0.0.0/8"}}]'
    args = cli.build_parser().parse_args(["run", "--training-network-policy", "off", "--metrics-from", peers])
    assert args.training_network_policy == "off"
    assert args.metrics_from == ({"ipBlock": {"cidr": "10.0.0.0/8"}},)


@pytest.mark.parametrize(("value", "said"), [
    ("{", "JSON list of NetworkPolicyPeers"),
    ('{"podSelector": {}}', "JSON list of NetworkPolicyPeers"),
    ('[{"pods": {}}]', "item 0 must be a NetworkPolicyPeer"),
    ("[{}]", "item 0 must be a NetworkPolicyPeer"),
])
def test_a_wrong_metrics_from_names_the_flag_and_the_value(value: str, said: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["run", "--metrics-from", value])
    err = capsys.readouterr().err
    assert "--metrics-from" in err and said in err
