"""`kubectl pets tensorboard` against a real kube-apiserver: the pod it makes, and that it is gone after.

No kubelet runs here: the test plays it, writing the pod's status Running and Ready, so the client
gets as far as its local forward; a connection to it closes, since no node serves the pod's port.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest
from kubernetes import client
from polling import wait_for

from pets_client import PetsTrainingClient, TensorBoardError
from pets_client import cli as pets_cli
from pets_client.tensorboard import SERVED_LABEL

pytestmark = pytest.mark.integration


@pytest.fixture()
def pets(kubeconfig: str, namespace: str, admin: client.ApiClient) -> PetsTrainingClient:
    core = client.CoreV1Api(admin)
    wait_for("the default ServiceAccount", lambda: core.list_namespaced_service_account(
        namespace, field_selector="metadata.name=default").items)
    return PetsTrainingClient(namespace=namespace, kubeconfig=kubeconfig)


def gone(core: client.CoreV1Api, namespace: str) -> bool:
    return all(p.metadata.deletion_timestamp for p in core.list_namespaced_pod(namespace).items)


def play_kubelet(core: client.CoreV1Api, namespace: str, selector: str, seen: list[Any]) -> threading.Thread:
    """Once the pod of ``selector`` is made: keep it in ``seen`` and mark it Running and Ready."""
    def run() -> None:
        pod = wait_for("the TensorBoard pod", lambda: next(
            iter(core.list_namespaced_pod(namespace, label_selector=selector).items), None))
        seen.append(pod)
        core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": {
            "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_tensorboard_pod_is_made_served_and_deleted(admin: client.ApiClient, pets: PetsTrainingClient,
                                                     namespace: str) -> None:
    core = client.CoreV1Api(admin)
    pets.train(name="kept", output={"persistentVolumeClaim": {"claimName": "outputs", "path": "/runs/a"}},
               imagePullSecrets=[{"name": "regcred"}])
    seen: list[Any] = []
    kubelet = play_kubelet(core, namespace, f"{SERVED_LABEL}=kept", seen)
    with pets.tensorboard("kept", port=0, image="example.org/trainer:1", timeout=60) as board:
        kubelet.join(timeout=5)
        pod = core.read_namespaced_pod(board.pod, namespace)
        assert pod.metadata.name == seen[0].metadata.name and board.served == ["kept"]
        c = pod.spec.containers[0]
        assert c.command == ["tensorboard", "--logdir", "/output/tensorboard", "--bind_all", "--port", "6006"]
        assert c.image == "example.org/trainer:1" and c.ports[0].container_port == 6006
        assert c.security_context.read_only_root_filesystem is True
        assert c.security_context.allow_privilege_escalation is False
        assert c.security_context.capabilities.drop == ["ALL"]
        assert pod.spec.security_context.run_as_non_root is True and pod.spec.security_context.run_as_user
        claim = next(v for v in pod.spec.volumes if v.persistent_volume_claim)
        assert claim.persistent_volume_claim.claim_name == "outputs"
        assert claim.persistent_volume_claim.read_only is True
        mount = next(m for m in c.volume_mounts if m.name == claim.name)
        assert mount.read_only is True and mount.sub_path == "runs/a" and mount.mount_path == "/output"
        assert pod.spec.image_pull_secrets[0].name == "regcred"
        assert board.url == f"http://localhost:{board.port}/" and board.forward_error is None
        # no node serves the pod: the API server refuses the portforward, and the connection just closes
        with socket.create_connection(("127.0.0.1", board.port), timeout=30) as conn:
            conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
            try:
                assert conn.recv(1024) == b""
            except ConnectionResetError:  # closed with our request unread
                pass
        wait_for("the forward's error", lambda: board.forward_error, 30)
    assert gone(core, namespace)


def test_tensorboard_all_and_its_clean_up_on_an_error(admin: client.ApiClient, pets: PetsTrainingClient,
                                                        namespace: str) -> None:
    """--all mounts each claimed training; a pod that does not start is deleted with the error."""
    core = client.CoreV1Api(admin)
    pets.train(name="a", output={"persistentVolumeClaim": {"claimName": "outputs", "path": "/a"}})
    pets.train(name="b", output={"managedClaim": {}})
    pets.train(name="scratch", output={"emptyDir": {}})
    seen: list[Any] = []
    real_create = pets.core.create_namespaced_pod

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(real_create(*args, **kwargs))
        return seen[-1]

    pets.core.create_namespaced_pod = spy  # type: ignore[method-assign]
    with pytest.raises(TensorBoardError, match="did not start within 3 s"):
        pets.tensorboard(port=0, timeout=3)
    (pod,) = seen
    assert pod.spec.containers[0].command[:3] == [
        "tensorboard", "--logdir_spec", "a:/outputs/a/tensorboard,b:/outputs/b/tensorboard"]
    assert sorted(v.persistent_volume_claim.claim_name for v in pod.spec.volumes
                  if v.persistent_volume_claim) == ["b-output", "outputs"]
    assert gone(core, namespace)


def test_kubectl_pets_tensorboard_names_spec_output_for_an_emptydir(
        pets: PetsTrainingClient, kubeconfig: str, namespace: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    pets.train(name="scratch", output={"emptyDir": {}})
    assert pets_cli.main(["tensorboard", "scratch", "-n", namespace, "--kubeconfig", kubeconfig]) == 1
    err = capsys.readouterr().err
    assert "emptyDir (spec.output)" in err and "spec.output.managedClaim" in err
    assert not client.CoreV1Api(pets.api_client).list_namespaced_pod(namespace).items


def test_a_tensorboard_pod_that_ends_at_once_says_so_and_is_deleted(
        admin: client.ApiClient, pets: PetsTrainingClient, namespace: str) -> None:
    """An image without `tensorboard` ends the pod at once: the error says it ended, not a time-out."""
    core = client.CoreV1Api(admin)
    pets.train(name="kept", output={"managedClaim": {}})

    def fail() -> None:
        pod = wait_for("the TensorBoard pod", lambda: next(
            iter(core.list_namespaced_pod(namespace, label_selector=f"{SERVED_LABEL}=kept").items), None))
        core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": {
            "phase": "Failed", "reason": "StartError"}})

    threading.Thread(target=fail, daemon=True).start()
    with pytest.raises(TensorBoardError, match=r"ended \(StartError\)"):
        pets.tensorboard("kept", port=0, timeout=60)
    assert gone(core, namespace)
