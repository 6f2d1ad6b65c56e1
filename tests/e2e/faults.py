"""Faults the e2e suites inject into the local cluster, from this machine (its nodes' containers run on this
kernel, and the control plane's processes are the harness's): the operator replica that acts SIGKILLed, a
control-plane process crashed and restarted, a worker node lost and brought back."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from polling import wait_for
from trainings import OPERATOR_NAMESPACE, POLL_S, RELEASE, REPO, cluster_kubeconfig, helm_binary

PEERING = ("kopf.dev", "v1", "clusterkopfpeerings", "pets-training")


def active_peer(custom: Any) -> tuple[str, list[str]]:
    """The operator pod that acts (the live peer with the highest priority), and every live peer."""
    peering = custom.get_cluster_custom_object(*PEERING)
    now = datetime.now(UTC)
    live = {pod: peer for pod, peer in (peering.get("status") or {}).items()
            if datetime.fromisoformat(peer["lastseen"]).replace(tzinfo=UTC) + timedelta(
                seconds=peer["lifetime"]) > now}
    return max(live, key=lambda pod: live[pod]["priority"], default=""), sorted(live)


def operator_pid(pod: str) -> int | None:
    """The host pid of the operator process of `pod` (kopf's peering identity is its POD_ID), or None
    while it has none (its container is restarting)."""
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if f"POD_ID={pod}".encode() in environ and b"pets-operator" in cmdline:
            return int(proc.name)
    return None


def kill_operator(pod: str) -> None:
    """SIGKILL the operator process of `pod`: it never leaves the peering object; its container restarts
    under the same identity."""
    pid = operator_pid(pod)
    if pid is None:
        pytest.fail(f"no pets-operator process with POD_ID={pod} here (run as root beside the cluster)")
    os.kill(pid, signal.SIGKILL)


def delete_operator_pod(core: Any, pod: str) -> None:
    """The operator's pod deleted with no grace (its process SIGKILLed, its peering record left to expire,
    as a lost node does), and replaced by its Deployment: a new pod, so no restart back-off builds up
    over many such kills (killing the process again and again would leave it in CrashLoopBackOff)."""
    core.delete_namespaced_pod(pod, OPERATOR_NAMESPACE, grace_period_seconds=0)


@contextlib.contextmanager
def operator_replicas(count: int) -> Iterator[None]:
    """The chart's replicaCount set to `count` (helm upgrade), back to 1 afterwards; waits until that
    many peers are live."""
    from kubernetes import client, config

    env = {**os.environ, "KUBECONFIG": str(cluster_kubeconfig())}
    scale = [helm_binary(), "upgrade", RELEASE, str(REPO / "charts" / "pets-training"), "--namespace",
             OPERATOR_NAMESPACE, "--reuse-values", "--wait", "--timeout", "5m"]
    subprocess.run([*scale, "--set", f"replicaCount={count}"], env=env, check=True)
    try:
        custom = client.CustomObjectsApi(config.new_client_from_config(str(cluster_kubeconfig())))
        wait_for(f"{count} live operator peers", lambda: len(active_peer(custom)[1]) == count, 120, POLL_S)
        yield
    finally:
        subprocess.run([*scale, "--set", "replicaCount=1"], env=env, check=True)


def cluster_sh(*args: str) -> None:
    subprocess.run([str(REPO / "tests" / "cluster" / "cluster.sh"), *args], check=True)


def crash_control_plane(component: str) -> None:
    """SIGKILL etcd, kube-apiserver or kube-controller-manager, and start it again on its data (local
    cluster: cluster.sh crash); returns once it serves."""
    if os.environ.get("PETS_CLUSTER") == "kind":
        pytest.fail("crashing the control plane is written for the local cluster (CLUSTER=local)")
    cluster_sh("crash", component)


def lose_node(node: str) -> None:
    if os.environ.get("PETS_CLUSTER") == "kind":
        subprocess.run(["docker", "kill", node], check=True)  # a kind node is a container
    else:
        cluster_sh("node-lose", node)


def restore_node(node: str) -> None:
    if os.environ.get("PETS_CLUSTER") == "kind":
        subprocess.run(["docker", "start", node], check=False)
    else:
        cluster_sh("node-start", node)
