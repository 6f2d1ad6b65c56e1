"""Smoke checks of a real cluster, run before the e2e suite: the things the trainer's pods rely on.

1. a pod runs to completion and its log comes back;
2. a pod of an Indexed Job resolves `<job>-0.<service>` behind a headless Service (the
   trainer's main-process address), and the name points at pod 0;
3. a pod reaches the API server in-cluster, through the `kubernetes` Service by its DNS name,
   with its service-account token, verifying the server against the cluster CA.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

POD_TIMEOUT_S = 180

# Resolves each name given (bounded retries: the DNS record appears once the endpoint is
# published), prints "name ip" per line, exits 1 with a clear message if one never resolves.
RESOLVE_SCRIPT = """
import socket, sys, time
for name in sys.argv[1:]:
    deadline = time.monotonic() + 90
    while True:
        try:
            print(name, socket.gethostbyname(name), flush=True)
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                sys.exit(f"{name} did not resolve in 90 s: {exc}")
            time.sleep(1)
"""

# GET /apis from inside the pod, as its service account, verifying the server's certificate.
API_SCRIPT = """
import json, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
token = open(sa + "/token").read()
ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
req = urllib.request.Request("https://kubernetes.default.svc/apis",
                             headers={"Authorization": "Bearer " + token})
with urllib.request.urlopen(req, context=ctx, timeout=20) as resp:
    body = json.load(resp)
print("kind", body["kind"])
print("groups", len(body["groups"]))
"""


def python_container(image: str, name: str, script: str, args: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["-c", script, *args],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
        },
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
    }


def pod_manifest(name: str, container: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "containers": [container]},
    }


def headless_service(name: str, job: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"job-name": job},
            "ports": [{"name": "rendezvous", "port": 29500}],
        },
    }


def indexed_job(name: str, service: str, container: dict[str, Any], completions: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": completions,
            "parallelism": completions,
            "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "subdomain": service, "containers": [container]}},
        },
    }


def wait_pod_finished(kube_api: Any, namespace: str, name: str) -> Any:
    """Watch a pod until it Succeeded or Failed; returns the pod."""
    from kubernetes import client, watch

    core = client.CoreV1Api(kube_api)
    deadline = time.monotonic() + POD_TIMEOUT_S
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, namespace)
        if pod.status.phase in ("Succeeded", "Failed"):
            return pod
        remaining = max(1, int(deadline - time.monotonic()))
        w = watch.Watch()
        for event in w.stream(
            core.list_namespaced_pod,
            namespace,
            field_selector=f"metadata.name={name}",
            resource_version=pod.metadata.resource_version,
            timeout_seconds=remaining,
        ):
            if event["object"].status.phase in ("Succeeded", "Failed"):
                w.stop()
                return event["object"]
    raise AssertionError(
        f"pod {namespace}/{name} not finished after {POD_TIMEOUT_S}s:\n" + describe(kube_api, namespace)
    )


def describe(kube_api: Any, namespace: str) -> str:
    """Pods, their logs and the events of a namespace: what a failed assertion should show."""
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    lines = []
    for pod in core.list_namespaced_pod(namespace).items:
        lines.append(f"pod {pod.metadata.name}: {pod.status.phase} {pod.status.container_statuses}")
        try:
            lines.append(core.read_namespaced_pod_log(pod.metadata.name, namespace, tail_lines=20))
        except Exception as exc:  # a pod that never started has no log
            lines.append(f"(no log: {exc})")
    for ev in core.list_namespaced_event(namespace).items:
        lines.append(f"event {ev.involved_object.kind}/{ev.involved_object.name}: {ev.reason} {ev.message}")
    return "\n".join(lines)


def succeeded_log(kube_api: Any, namespace: str, name: str) -> str:
    from kubernetes import client

    pod = wait_pod_finished(kube_api, namespace, name)
    log = client.CoreV1Api(kube_api).read_namespaced_pod_log(name, namespace)
    assert pod.status.phase == "Succeeded", (
        f"pod {name} {pod.status.phase}; log:\n{log}\n{describe(kube_api, namespace)}"
    )
    return str(log)


def test_pod_runs(kube_api: Any, namespace: str, smoke_image: str) -> None:
    from kubernetes import utils

    container = python_container(
        smoke_image, "hello", "import platform; print('hello from', platform.node())", []
    )
    utils.create_from_dict(kube_api, pod_manifest("hello", container), namespace=namespace)
    assert succeeded_log(kube_api, namespace, "hello").strip() == "hello from hello"


def test_indexed_job_resolves_rank0(kube_api: Any, namespace: str, smoke_image: str) -> None:
    from kubernetes import client, utils

    job, service = "smoke-job", "smoke-svc"
    rank0 = f"{job}-0.{service}"
    fqdn = f"{rank0}.{namespace}.svc.cluster.local"
    utils.create_from_dict(kube_api, headless_service(service, job), namespace=namespace)
    container = python_container(smoke_image, "resolve", RESOLVE_SCRIPT, [rank0, fqdn])
    utils.create_from_dict(kube_api, indexed_job(job, service, container, completions=2), namespace=namespace)

    core = client.CoreV1Api(kube_api)
    deadline = time.monotonic() + POD_TIMEOUT_S
    pods: list[Any] = []
    while len(pods) < 2 and time.monotonic() < deadline:
        pods = core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items
        if len(pods) < 2:
            time.sleep(1)
    assert len(pods) == 2, (
        f"the Indexed Job made {len(pods)} pods, expected 2:\n{describe(kube_api, namespace)}"
    )

    by_index = {p.metadata.annotations["batch.kubernetes.io/job-completion-index"]: p for p in pods}
    logs = {i: succeeded_log(kube_api, namespace, p.metadata.name) for i, p in by_index.items()}
    pod0_ip = core.read_namespaced_pod(by_index["0"].metadata.name, namespace).status.pod_ip
    for index, log in logs.items():
        resolved = dict(line.split() for line in log.splitlines() if line.strip())
        assert resolved == {rank0: pod0_ip, fqdn: pod0_ip}, (
            f"index {index} resolved {resolved}, pod 0 is {pod0_ip}"
        )


def test_pod_reaches_api_server(kube_api: Any, namespace: str, smoke_image: str) -> None:
    from kubernetes import utils

    container = python_container(smoke_image, "api", API_SCRIPT, [])
    utils.create_from_dict(kube_api, pod_manifest("api", container), namespace=namespace)
    lines = dict(line.split() for line in succeeded_log(kube_api, namespace, "api").splitlines())
    assert lines["kind"] == "APIGroupList"
    assert int(lines["groups"]) > 5
