"""The Python client (src/pets_client) and `kubectl pets` against a real kube-apiserver.

No kubelet (and no scheduler) runs here: the tests play the job controller as
test_operator_lifecycle.py does, or write a PetsTraining's status by hand with the operator paused.
"""

from __future__ import annotations

import io
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from pets_operator import api
from polling import wait_for

from pets_client import (
    FetchError,
    InvalidTrainingError,
    LogsError,
    PetsTrainingClient,
    TrainingNotFoundError,
    WaitTimeoutError,
)
from pets_client import cli as pets_cli

pytestmark = pytest.mark.integration
OperatorThread = Any  # the `operator` fixture's type (tests/integration/conftest.py)
NOW = "%Y-%m-%dT%H:%M:%SZ"


# Playing the job controller, as tests/integration/test_operator_lifecycle.py does (copied rather than
# imported: importing a conftest by name breaks when the integration and e2e suites are collected together).


def now() -> str:
    return datetime.now(UTC).strftime(NOW)


def the_job(admin: client.ApiClient, ns: str, name: str) -> client.V1Job:
    return wait_for(f"Job {ns}/{name}", lambda: next(
        (j for j in client.BatchV1Api(admin).list_namespaced_job(ns).items
         if j.metadata.name == name and not j.metadata.deletion_timestamp), None))


def job_status(admin: client.ApiClient, ns: str, name: str, st: dict[str, Any]) -> None:
    client.BatchV1Api(admin).patch_namespaced_job_status(name, ns, {"status": st})


def run_job(admin: client.ApiClient, ns: str, name: str, n: int) -> None:
    job_status(admin, ns, name, {"startTime": now(), "active": n, "ready": n})


def finish_job(admin: client.ApiClient, ns: str, name: str, n: int) -> None:
    started = client.BatchV1Api(admin).read_namespaced_job(name, ns).status.start_time
    t = now()
    job_status(admin, ns, name, {
        "startTime": started.strftime(NOW) if started else t,
        "active": 0, "ready": 0, "succeeded": n, "completedIndexes": f"0-{n - 1}" if n > 1 else "0",
        "completionTime": t,
        "conditions": [{"type": c, "status": "True", "reason": "CompletionsReached", "message": "done",
                        "lastTransitionTime": t, "lastProbeTime": t}
                       for c in ("SuccessCriteriaMet", "Complete")]})


def wait_phase(admin: client.ApiClient, ns: str, name: str, phase: str,
               timeout: float = 60) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        pt = client.CustomObjectsApi(admin).get_namespaced_custom_object(api.GROUP, api.VERSION, ns,
                                                                          api.PLURAL, name)
        return pt if (pt.get("status") or {}).get("phase") == phase else None

    return wait_for(f"{ns}/{name} to be {phase}", probe, timeout)  # type: ignore[no-any-return]


@pytest.fixture()
def pets(kubeconfig: str, namespace: str) -> PetsTrainingClient:
    return PetsTrainingClient(namespace=namespace, kubeconfig=kubeconfig)


def set_status(admin: client.ApiClient, ns: str, name: str, status: dict[str, Any]) -> None:
    client.CustomObjectsApi(admin).patch_namespaced_custom_object_status(
        api.GROUP, api.VERSION, ns, api.PLURAL, name, {"status": status})


def test_namespace_defaults_to_the_kubeconfig_context(kubeconfig: str, tmp_path: Path) -> None:
    cfg = yaml.safe_load(Path(kubeconfig).read_text())
    assert PetsTrainingClient(kubeconfig=kubeconfig).namespace == (
        next(c for c in cfg["contexts"] if c["name"] == cfg["current-context"])["context"].get("namespace")
        or "default")
    for ctx in cfg["contexts"]:
        if ctx["name"] == cfg["current-context"]:
            ctx["context"]["namespace"] = "team-a"
    other = tmp_path / "kubeconfig"
    other.write_text(yaml.safe_dump(cfg))
    assert PetsTrainingClient(kubeconfig=str(other)).namespace == "team-a"
    assert PetsTrainingClient(namespace="x", kubeconfig=str(other)).namespace == "x"


def test_train_creates_a_training_with_a_generated_name(pets: PetsTrainingClient) -> None:
    name = pets.train(epochs=1, batch_size=8, backend="job")
    assert name.startswith("pets-")
    got = pets.get(name)
    # the API server applied the defaults
    assert got["spec"]["epochs"] == 1 and got["spec"]["batchSize"] == 8 and got["spec"]["replicas"] == 1
    manifest = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "from-yaml"},
                "spec": {"epochs": 3, "backend": "job"}}
    assert pets.train(manifest, replicas=2) == "from-yaml"
    assert pets.get("from-yaml")["spec"]["replicas"] == 2
    assert pets.train({"epochs": 2}, name="named") == "named"


@pytest.mark.parametrize(("fields", "named"), [
    ({"replicas": 0}, "spec.replicas"),
    ({"mixedPrecision": "fp8"}, "spec.mixedPrecision"),
    ({"dataset": {"synthetic": {}, "hostPath": {"path": "/data"}}}, "spec.dataset"),
    ({"masterPort": 9090}, "spec.masterPort"),
])
def test_train_with_a_bad_field_raises_naming_it(pets: PetsTrainingClient, fields: dict[str, Any],
                                                 named: str) -> None:
    with pytest.raises(InvalidTrainingError) as err:
        pets.train(**fields)
    assert named in str(err.value), err.value
    assert err.value.status == 422
    assert any(f.startswith(named) for f in err.value.fields), err.value.fields
    assert pets.list() == []


def test_wait_returns_the_final_status_from_a_watch(admin: client.ApiClient, operator: OperatorThread,
                                                    pets: PetsTrainingClient, namespace: str) -> None:
    name = pets.train(name="waited", replicas=2, epochs=2, backend="job")
    reads: list[str] = []
    real_get = pets.custom.get_namespaced_custom_object

    def counting_get(*args: Any, **kwargs: Any) -> Any:
        reads.append(args[-1])
        return real_get(*args, **kwargs)

    pets.custom.get_namespaced_custom_object = counting_get  # type: ignore[method-assign]

    def play_job_controller() -> None:
        the_job(admin, namespace, name)
        wait_phase(admin, namespace, name, api.PENDING)
        run_job(admin, namespace, name, 2)
        wait_phase(admin, namespace, name, api.RUNNING)
        finish_job(admin, namespace, name, 2)

    driver = threading.Thread(target=play_job_controller, daemon=True)
    driver.start()
    out = io.StringIO()
    status = pets.wait(name, timeout=120, file=out)
    driver.join(30)
    assert status["phase"] == api.SUCCEEDED, status
    assert status["completionTime"]
    assert len(reads) == 1, f"wait polled: {len(reads)} GETs (it should read once, then watch)"
    text = out.getvalue()
    assert f"{name}: {api.RUNNING}" in text and f"{name}: {api.SUCCEEDED}" in text, text
    assert text.index(api.RUNNING) < text.rindex(api.SUCCEEDED), text


def test_wait_shows_steps_loss_accuracy_and_throughput(admin: client.ApiClient, operator_paused: None,
                                                       pets: PetsTrainingClient, namespace: str) -> None:
    name = pets.train(name="bar", epochs=2)
    # `wait` reads the training once, then watches from that read's resourceVersion: every status
    # written after the read reaches it, in order. So the statuses are written once it has read, with
    # no sleeps between them (a sleep only guessed when the read had happened).
    read = threading.Event()
    real_get = pets.get

    def get_then_signal(*args: Any, **kwargs: Any) -> Any:
        got = real_get(*args, **kwargs)
        read.set()
        return got

    pets.get = get_then_signal  # type: ignore[method-assign]

    def progress() -> None:
        assert read.wait(30), "wait never read the training"
        set_status(admin, namespace, name, {"phase": "Pending", "message": "0/1 nodes are available: "
                                             "Insufficient cpu"})
        set_status(admin, namespace, name, {
            "phase": "Running", "message": "1/1 pods ready", "epoch": 1, "totalEpochs": 2, "step": 5,
            "stepsTotal": 10, "trainLoss": 1.2345, "evalAccuracy": 0.5, "imagesPerSecond": 42.0})
        set_status(admin, namespace, name, {
            "phase": "Succeeded", "message": "done", "epoch": 2, "totalEpochs": 2, "step": 10,
            "stepsTotal": 10, "trainLoss": 0.9, "evalAccuracy": 0.75, "imagesPerSecond": 40.0,
            "summary": {"final_accuracy": 0.75}})

    driver = threading.Thread(target=progress, daemon=True)
    driver.start()
    out = io.StringIO()
    status = pets.wait(name, timeout=60, file=out)
    driver.join(10)
    assert status["phase"] == "Succeeded"
    text = out.getvalue()
    assert "Pending: 0/1 nodes are available: Insufficient cpu" in text, text
    assert "loss=1.2345" in text and "acc=50.0%" in text and "img/s=42.0" in text, text
    assert "10/10" in text, text
    assert "final accuracy 0.7500 (75.0%)" in text, text


@pytest.mark.timeout(60, func_only=True)  # a wait past its timeout would take a watch chunk (300 s)
def test_wait_times_out_with_the_last_status(operator_paused: None, pets: PetsTrainingClient) -> None:
    name = pets.train(name="slow")
    with pytest.raises(WaitTimeoutError) as err:
        pets.wait(name, timeout=2, progress=False)
    assert "slow" in str(err.value) and err.value.status == {}


def test_wait_on_a_missing_training(pets: PetsTrainingClient) -> None:
    with pytest.raises(TrainingNotFoundError, match="nope"):
        pets.wait("nope", timeout=5, progress=False)


def test_list_suspend_resume_delete(admin: client.ApiClient, operator: OperatorThread,
                                    pets: PetsTrainingClient, namespace: str) -> None:
    for n in ("one", "two"):
        pets.train(name=n, epochs=1, backend="job")
    assert [o["metadata"]["name"] for o in pets.list()] == ["one", "two"]
    the_job(admin, namespace, "one")

    pets.suspend("one")
    assert pets.get("one")["spec"]["suspend"] is True
    wait_for("the Job to be suspended", lambda: the_job(admin, namespace, "one").spec.suspend is True)
    pets.resume("one")
    assert pets.get("one")["spec"]["suspend"] is False
    wait_for("the Job to be resumed", lambda: the_job(admin, namespace, "one").spec.suspend is False)

    pets.delete("two")
    wait_for("two to be gone", lambda: [o["metadata"]["name"] for o in pets.list()] == ["one"])
    with pytest.raises(TrainingNotFoundError):
        pets.delete("two")
    with pytest.raises(TrainingNotFoundError):
        pets.suspend("two")


def test_logs_says_when_there_is_no_pod(admin: client.ApiClient, operator: OperatorThread,
                                        pets: PetsTrainingClient, namespace: str) -> None:
    pets.train(name="quiet", replicas=2, backend="job")
    the_job(admin, namespace, "quiet")
    wait_phase(admin, namespace, "quiet", api.PENDING)
    with pytest.raises(LogsError, match="no pod of rank 1"):
        pets.logs("quiet", rank=1)


def test_fetch_refuses_an_emptydir_output(pets: PetsTrainingClient) -> None:
    pets.train(name="scratch", output={"emptyDir": {}})
    with pytest.raises(FetchError, match="emptyDir") as err:
        pets.fetch("scratch", "out")
    assert "spec.output.persistentVolumeClaim" in str(err.value)


def test_fetch_pod_is_valid_and_cleaned_up(admin: client.ApiClient, pets: PetsTrainingClient,
                                           namespace: str, tmp_path: Path) -> None:
    """No scheduler runs here, so the fetch pod never starts: the API server accepts it (a valid,
    read-only mount of the claim), fetch says it did not start, and the pod is gone afterwards."""
    core = client.CoreV1Api(admin)
    wait_for("the default ServiceAccount", lambda: core.list_namespaced_service_account(
        namespace, field_selector="metadata.name=default").items)
    pets.train(name="kept", output={"persistentVolumeClaim": {"claimName": "outputs", "path": "/runs/a"}},
               image="example.org/trainer:1", imagePullSecrets=[{"name": "regcred"}])
    seen: list[Any] = []
    real_create = pets.core.create_namespaced_pod

    def spy(*args: Any, **kwargs: Any) -> Any:
        pod = real_create(*args, **kwargs)
        seen.append(pod)
        return pod

    pets.core.create_namespaced_pod = spy  # type: ignore[method-assign]
    with pytest.raises(FetchError, match="did not start within 3 s"):
        pets.fetch("kept", tmp_path, timeout=3)
    (pod,) = seen
    c = pod.spec.containers[0]
    assert c.image == "example.org/trainer:1" and c.image_pull_policy == "IfNotPresent"
    assert c.volume_mounts[0].read_only is True and c.volume_mounts[0].sub_path == "runs/a"
    assert pod.spec.volumes[0].persistent_volume_claim.claim_name == "outputs"
    assert pod.spec.volumes[0].persistent_volume_claim.read_only is True
    assert pod.spec.image_pull_secrets[0].name == "regcred"
    assert not core.list_namespaced_pod(namespace).items or all(
        p.metadata.deletion_timestamp for p in core.list_namespaced_pod(namespace).items)


def test_kubectl_pets_commands(admin: client.ApiClient, operator_paused: None, kubeconfig: str,
                               namespace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["-n", namespace, "--kubeconfig", kubeconfig]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"apiVersion": api.API_VERSION, "kind": api.KIND,
                                   "metadata": {"name": "bad"}, "spec": {"replicas": 0}}))
    assert pets_cli.main(["run", "-f", str(bad), *common]) == 1
    assert "spec.replicas" in capsys.readouterr().err

    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({"apiVersion": api.API_VERSION, "kind": api.KIND,
                                    "metadata": {"name": "cli"},
                                    "spec": {"epochs": 1, "output": {"emptyDir": {}}}}))
    assert pets_cli.main(["run", "-f", str(good), *common]) == 0
    assert "petstraining.training.pets.dev/cli created" in capsys.readouterr().out

    set_status(admin, namespace, "cli", {"phase": "Failed", "message": "boom", "epoch": 0, "totalEpochs": 1})
    assert pets_cli.main(["wait", "cli", *common]) == 1
    assert "boom" in capsys.readouterr().err

    assert pets_cli.main(["list", *common]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[0].split() == ["NAME", "PHASE", "REPLICAS", "EPOCH", "ACCURACY", "AGE"]
    assert listing[1].split()[:4] == ["cli", "Failed", "1", "0/1"]

    assert pets_cli.main(["suspend", "cli", *common]) == 0
    assert pets_cli.main(["resume", "cli", *common]) == 0
    assert pets_cli.main(["fetch", "cli", str(tmp_path / "out"), *common]) == 1
    assert "emptyDir" in capsys.readouterr().err
    assert pets_cli.main(["delete", "cli", *common]) == 0
    assert "cli deleted" in capsys.readouterr().out


def test_notebook_runs_in_a_real_kernel_up_to_the_wait(admin: client.ApiClient, operator_paused: None,
                                                        kubeconfig: str, namespace: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/train-from-python.ipynb through nbclient and ipykernel, its cells up to `wait`, with this
    test writing the training's status (no pods run here; the e2e suite runs the whole notebook)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(Path(__file__).resolve().parents[2] / "examples" / "train-from-python.ipynb", 4)
    last = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "pets.wait(" in c.source)
    nb.cells = nb.cells[:last + 1]
    monkeypatch.setenv("PETS_NAMESPACE", namespace)
    monkeypatch.setenv("PETS_OUTPUT_CLAIM", "outputs")
    monkeypatch.setenv("PETS_TIMEOUT", "120")
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    custom = client.CustomObjectsApi(admin)

    def finish() -> None:
        (pt,) = wait_for("the notebook's training", lambda: custom.list_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL)["items"], 120, 0.5)
        name = pt["metadata"]["name"]
        # No sleep between the two: the kernel's `wait` may read before, between or after them, and
        # what this test asserts (the final line, a bar with loss and accuracy) holds in each case.
        set_status(admin, namespace, name, {"phase": "Running", "epoch": 1, "totalEpochs": 2, "step": 6,
                                            "stepsTotal": 12, "trainLoss": 1.1, "evalAccuracy": 0.5})
        set_status(admin, namespace, name, {"phase": "Succeeded", "epoch": 2, "totalEpochs": 2, "step": 12,
                                            "stepsTotal": 12, "trainLoss": 0.8, "evalAccuracy": 0.625})

    driver = threading.Thread(target=finish, daemon=True)
    driver.start()
    NotebookClient(nb, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    driver.join(10)
    (pt,) = custom.list_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL)["items"]
    assert pt["metadata"]["name"].startswith("pets-")
    assert pt["spec"]["output"] == {"persistentVolumeClaim": {"claimName": "outputs", "path": "/",
                                                              "readOnly": False}}
    assert pt["spec"]["pretrained"] is False
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "phase Succeeded, eval accuracy 0.625 after 2 epochs" in text, text
    assert "loss=" in text and "acc=" in text, text
