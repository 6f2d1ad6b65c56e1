"""End to end, with NetworkPolicy enforced: the policy the operator makes around each training.

The local cluster's bridge CNI enforces no NetworkPolicy, so `make cluster-up` runs an enforcer on
every node (`cluster.sh netpol-up NODE`; this module starts them itself on a cluster brought up with
POLICY=0, and stops them after): SIG Network's
kube-network-policies where the kernel takes nftables' `queue` statement, else kube-router's policy
controller (tests/cluster/lib.sh netpol_enforcer; docs/cluster.md, NetworkPolicy enforcement). The
2-core CI machine's kernel lacks that statement (CONFIG_NFT_QUEUE), so kube-router enforces there: on
2026-11-26 both tests failed with kube-network-policies (fail-open, it policed nothing) and passed with
kube-router. A refusal the tests expect is a connection attempt that times out; the same connection
succeeding once the policy is deleted proves the refusal was the policy's.

- A training trains to Succeeded with its policy in place (across two nodes where there are two workers),
  its progress read by the operator all along.
- While it trains, a pod in another namespace and a pod of the same namespace that is not its trainer
  cannot open a TCP connection to rank 0's rendezvous port; once the policy is deleted, the same
  connection from the same pod succeeds, which proves the refusals came from the policy.
- Every route by which a person could get a pod with the training's labels (a Pod, a Deployment, a Job,
  a Job with manualSelector copying the operator Job's selector and labels, a CronJob; a PyTorchJob where
  the training-operator's CRD is installed) is refused at admission (the chart's trainer-pod and
  trainer-workload policies), or, if admitted, its pod reaches neither rank 0's rendezvous nor its
  progress port (docs/threat-model.md, "The network").
- Progress the operator cannot read, because a NetworkPolicy denies it, is said in a condition.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from polling import wait_for
from trainings import (
    CLUSTER_SH,
    LONGER_SPEC,
    POLL_S,
    REPO,
    Trainings,
    addon,
    dedicated_control_plane,
    kubectl,
    pod_of_rank,
)

from pets_contract.names import DEFAULT_IMAGE

pytestmark = pytest.mark.e2e

IMAGE = DEFAULT_IMAGE  # the trainer image make e2e loaded
RENDEZVOUS_PORT = 29500  # spec.masterPort's default
PROGRESS_PORT = 9090
REFUSED_WITHIN_S = 3  # a dropped SYN: the connect attempt times out
ROUTE_LABEL = "e2e.pets.dev/route"  # on each route's pod template, to find the pods of one admitted
ROUTE_POD_S = 90  # an admitted route's pod to run: a CronJob's first Job starts on the next minute
REFUSAL = "create a PetsTraining instead"  # in both policies' messages: a refusal of ours, not a typo's


@pytest.fixture(scope="module")
def enforcer(kube_api: Any) -> Iterator[list[str]]:
    """The enforcer on every node of the local cluster; the names of the nodes. `make cluster-up` starts
    one (tests/cluster/cluster.sh, PETS_NETPOL=1 unless POLICY=0); on a cluster brought up without, this
    module starts one on every node for its duration."""
    from kubernetes import client

    nodes = [n.metadata.name for n in client.CoreV1Api(kube_api).list_node().items]
    state = Path(os.environ.get("PETS_STATE", "/tmp/pets-training-cluster"))
    # kind's CNI (kindnet, v0.24 and later) enforces NetworkPolicy itself.
    if os.environ.get("PETS_CLUSTER") == "kind" or (state / "netpol-enforcer").is_file():
        yield nodes
        return
    build = subprocess.run([str(REPO / "tests" / "cluster" / "build.sh"), "netpol"], text=True,
                           capture_output=True)
    if build.returncode != 0:
        pytest.fail(f"build.sh netpol failed:\n{build.stdout[-3000:]}\n{build.stderr[-3000:]}")
    for node in nodes:
        up = subprocess.run([str(CLUSTER_SH), "netpol-up", node], text=True, capture_output=True)
        if up.returncode != 0:
            pytest.fail(f"cluster.sh netpol-up {node} failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}")
    yield nodes
    for node in nodes:
        subprocess.run([str(CLUSTER_SH), "netpol-down", node], check=False)


def prober(namespace: str, name: str, labels: dict[str, str] | None = None) -> str:
    """A pod that only waits, to open connections from (the trainer image, the trainers' hardening)."""
    kubectl("-n", namespace, "apply", "-f", "-", input_text=yaml.safe_dump(probe_pod(name, labels)))
    kubectl("-n", namespace, "wait", "--for=condition=Ready", f"pod/{name}", "--timeout=180s")
    return name


def probe_pod(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {"app": name}},
           "spec": {"securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "probe", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                                    "command": ["python3", "-c", "import time; time.sleep(3600)"],
                                    "resources": {"requests": {"cpu": "10m", "memory": "64Mi"},
                                                  "limits": {"cpu": "200m", "memory": "256Mi"}},
                                    "securityContext": {"allowPrivilegeEscalation": False,
                                                        "capabilities": {"drop": ["ALL"]},
                                                        "readOnlyRootFilesystem": True}}]}}


def trainer_labels(name: str) -> dict[str, str]:
    return {"training.pets.dev/training": name, "app.kubernetes.io/component": "trainer"}


def routes(name: str, job: Any) -> dict[str, dict[str, Any]]:
    """Each way a person might get a pod labelled as `name`'s trainer, keyed by route: the object to apply.
    Every pod template is the prober's, labelled as the training's trainer (and with the route).
    `job`: the operator's Job of the training, whose selector and labels the manualSelector Job copies."""
    def template(route: str, labels: dict[str, str] | None = None, restart: str = "Never") -> dict[str, Any]:
        pod = probe_pod(f"{route}-pod", {**(labels or trainer_labels(name)), ROUTE_LABEL: route})
        return {"metadata": {"labels": pod["metadata"]["labels"]},
                "spec": {**pod["spec"], "restartPolicy": restart}}

    def workload(kind: str, route: str, spec: dict[str, Any], labels: dict[str, str] | None = None
                 ) -> dict[str, Any]:
        return {"apiVersion": "apps/v1" if kind == "Deployment" else "batch/v1", "kind": kind,
                "metadata": {"name": route, **({"labels": labels} if labels else {})}, "spec": spec}

    copied = {**job.spec.template.metadata.labels}  # controller-uid, job-name and the training's
    # The Jobs first: on a cluster where a route is open, they fail at once; the Deployment's pods, if it
    # is admitted, are refused (its ReplicaSet controller makes no trainer pods), which takes ROUTE_POD_S.
    return {
        "job": workload("Job", "route-job", {"backoffLimit": 0, "template": template("job")}),
        "job-manual-selector": workload("Job", "route-job-manual-selector", {
            "manualSelector": True, "selector": {"matchLabels": {**job.spec.selector.match_labels}},
            "backoffLimit": 0, "template": template("job-manual-selector", copied)},
            labels={**(job.metadata.labels or {})}),
        "cronjob": workload("CronJob", "route-cronjob", {
            "schedule": "* * * * *", "concurrencyPolicy": "Forbid",
            "jobTemplate": {"spec": {"backoffLimit": 0, "template": template("cronjob")}}}),
        "pod": probe_pod("route-pod", {**trainer_labels(name), ROUTE_LABEL: "pod"}),
        "deployment": workload("Deployment", "route-deployment", {
            "replicas": 1, "selector": {"matchLabels": {ROUTE_LABEL: "deployment"}},
            "template": template("deployment", restart="Always")}),
    }


def route_closed(namespace: str, route: str, manifest: dict[str, Any], ip: str) -> str:
    """How `route` is closed: refused at admission, or admitted and its pod reaching neither rank 0's
    rendezvous nor its progress port at `ip` (no pod within ROUTE_POD_S counts as reaching nothing).
    Fails the test when the pod reaches either."""
    made = kubectl("-n", namespace, "apply", "-f", "-", input_text=yaml.safe_dump(manifest), check=False)
    if made.returncode != 0:
        assert REFUSAL in made.stderr and "training.pets.dev/training" in made.stderr, (route, made.stderr)
        return "refused at admission"

    def running() -> str | None:
        pods = kubectl("-n", namespace, "get", "pods", "-l", f"{ROUTE_LABEL}={route}",
                       "--field-selector=status.phase=Running", "-o", "name", check=False).stdout.split()
        return pods[0].removeprefix("pod/") if pods else None

    deadline = time.monotonic() + ROUTE_POD_S
    while (pod := running()) is None:
        if time.monotonic() > deadline:
            return f"admitted; no pod running within {ROUTE_POD_S} s"
        time.sleep(POLL_S)
    for port in (RENDEZVOUS_PORT, PROGRESS_PORT):
        assert not connects(namespace, pod, ip, port), \
            f"route {route}: admitted, and its pod {pod} reached rank 0's {ip}:{port}"
    return "admitted; its pod reached neither port"


def connects(namespace: str, pod: str, ip: str, port: int) -> bool:
    """Whether `pod` can open a TCP connection to ip:port (and close it at once, sending nothing)."""
    code = (f"import socket; socket.create_connection(({ip!r}, {port}), timeout={REFUSED_WITHIN_S}).close()")
    result = kubectl("-n", namespace, "exec", pod, "--", "python3", "-c", code, check=False)
    return result.returncode == 0


def progress_condition(trainings: Trainings, name: str, status: str) -> Callable[[], dict[str, Any] | None]:
    def probe() -> dict[str, Any] | None:
        conds = trainings.status(name).get("conditions") or []
        return next((c for c in conds if c["type"] == "ProgressReported" and c["status"] == status), None)
    return probe


def unreadable_events(trainings: Trainings, name: str) -> list[str]:
    return kubectl("-n", trainings.namespace, "get", "events", "--field-selector",
                   f"involvedObject.name={name},reason=ProgressUnreadable", "-o", "name").stdout.split()


def test_only_the_trainings_own_pods_reach_its_rendezvous_and_it_trains(
        enforcer: list[str], trainings: Trainings, other_tenant: Trainings, kube_api: Any) -> None:
    from kubernetes import client

    workers = [n for n in client.CoreV1Api(kube_api).list_node().items if not dedicated_control_plane(n)]
    name = "guarded"
    # Long enough to be running after three refused connects (3 s each), the routes' refusals and the
    # policy's deletion.
    spec = {**LONGER_SPEC, "epochs": 12}
    if len(workers) >= 2:
        spec["placement"] = {"spreadAcrossNodes": True}
    trainings.create(name, spec)
    # Probes started while the training starts: another tenant's pod, and a pod of the same namespace
    # that is no trainer of this training.
    outsider = prober(other_tenant.namespace, "outsider")
    neighbour = prober(trainings.namespace, "neighbour", {"app.kubernetes.io/component": "trainer"})
    policy = kubectl("-n", trainings.namespace, "get", "networkpolicy", name, "-o", "json").stdout
    assert '"training.pets.dev/training": "guarded"' in policy, policy
    # Mid-run: rank 0's rendezvous store is up for the whole run, and progress has been read (step > 0).
    wait_for(f"{name} status.step > 0", lambda: (trainings.status(name).get("step") or 0) > 0, 600, POLL_S)
    rank0 = pod_of_rank(trainings.pods(name), 0)
    ip = rank0.status.pod_ip
    if len(workers) >= 2:
        assert len({p.spec.node_name for p in trainings.pods(name)}) == 2, "the ranks on two nodes"

    assert not connects(other_tenant.namespace, outsider, ip, RENDEZVOUS_PORT), \
        f"a pod in {other_tenant.namespace} reached {name}'s rendezvous {ip}:{RENDEZVOUS_PORT}"
    assert not connects(trainings.namespace, neighbour, ip, RENDEZVOUS_PORT), \
        f"a pod of the same namespace reached {name}'s rendezvous {ip}:{RENDEZVOUS_PORT}"
    assert not connects(other_tenant.namespace, outsider, ip, PROGRESS_PORT), \
        "the progress port is the operator's (and the chart's metricsFrom), not any pod's"
    assert progress_condition(trainings, name, "True")(), trainings.status(name).get("conditions")

    # No route gets a person a peer of the training: a pod with its labels, or a workload whose pods the
    # Job controller (a trusted creator of trainer pods) would make with them.
    (job,) = trainings.jobs(name)
    tried = routes(name, job)
    try:
        closed = {route: route_closed(trainings.namespace, route, manifest, ip)
                  for route, manifest in tried.items()}
    finally:
        kubectl("-n", trainings.namespace, "delete", "--ignore-not-found", "--wait=false", "-f", "-",
                input_text=yaml.safe_dump_all(list(tried.values())), check=False)
    print(f"routes to {name}'s peers, each closed: {closed}")

    # The same connection with the policy gone succeeds: the refusals above were the policy's.
    kubectl("-n", trainings.namespace, "delete", "networkpolicy", name)
    wait_for(f"{outsider} to reach {ip}:{RENDEZVOUS_PORT} once the policy is gone",
             lambda: connects(other_tenant.namespace, outsider, ip, RENDEZVOUS_PORT), 30, POLL_S)

    status = trainings.wait_phase(name, "Succeeded")
    assert status["restarts"] == 0, status
    assert progress_condition(trainings, name, "True")(), status.get("conditions")
    assert unreadable_events(trainings, name) == [], "progress was unreadable at some point"


def test_a_pytorchjob_made_by_hand_is_refused_at_admission(trainings: Trainings) -> None:
    """Kubeflow's training-operator, a trusted creator of trainer pods, would make this PyTorchJob's pods
    with the training's labels: it is refused at admission (the chart's trainer-workload policy), naming the
    replica type's template label. No training is needed for that, nor an enforcer."""
    addon("kubeflow")  # the real training-operator and its CRD (fast when test_backends_and_queues made it)
    template = {"metadata": {"labels": trainer_labels("guarded")},
                "spec": {**probe_pod("x")["spec"], "restartPolicy": "Never"}}
    template["spec"]["containers"][0]["name"] = "pytorch"
    pytorchjob = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "route-pj"},
                  "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "restartPolicy": "Never",
                                                              "template": template}}}}
    made = kubectl("-n", trainings.namespace, "apply", "-f", "-", input_text=yaml.safe_dump(pytorchjob),
                   check=False)
    if made.returncode == 0:
        kubectl("-n", trainings.namespace, "delete", "pytorchjob", "route-pj", "--wait=false", check=False)
    assert made.returncode != 0 and REFUSAL in made.stderr, made
    assert ('spec.pytorchReplicaSpecs[Master].template.metadata.labels[training.pets.dev/training]: "guarded"'
            in made.stderr), made.stderr


def test_progress_a_network_policy_denies_is_said_in_a_condition(enforcer: list[str],
                                                                 trainings: Trainings) -> None:
    """spec.networkPolicy: false, and a policy of the namespace's that admits nothing to the training's
    pods: the operator cannot read rank 0's progress, and says so; with that policy gone, it reads again."""
    name = "no-progress"
    # Long enough to be running still after the 30 s grace, 15 s of failed reads and the policy's deletion:
    # a finished training's progress is not read, so the condition could not turn True again.
    trainings.create(name, {**LONGER_SPEC, "replicas": 1, "epochs": 16, "networkPolicy": False})
    trainings.wait_phase(name, "Running")
    rank0 = wait_for("rank 0's pod IP",
                     lambda: (p := pod_of_rank(trainings.pods(name), 0)).status.pod_ip and p, 60, POLL_S)
    assert kubectl("-n", trainings.namespace, "get", "networkpolicy", "-o", "name").stdout == ""
    deny = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "deny-all"},
            "spec": {"podSelector": {"matchLabels": {"training.pets.dev/training": name}},
                     "policyTypes": ["Ingress"]}}
    kubectl("-n", trainings.namespace, "apply", "-f", "-", input_text=yaml.safe_dump(deny))
    # 30 s of start-up grace after rank 0's container started, then reads failing for 15 s.
    cond = wait_for("ProgressReported=False", progress_condition(trainings, name, "False"), 120, POLL_S)
    assert cond["reason"] == "EndpointUnreachable", cond
    assert f"{rank0.status.pod_ip}:{PROGRESS_PORT}" in cond["message"], cond
    assert len(unreadable_events(trainings, name)) == 1
    kubectl("-n", trainings.namespace, "delete", "networkpolicy", "deny-all")
    wait_for("ProgressReported=True again", progress_condition(trainings, name, "True"), 60, POLL_S)

