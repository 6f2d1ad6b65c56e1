"""End to end: the Python client, its notebook and the `kubectl pets` plugin on a real cluster.

Run by tests/e2e/run.sh (`make e2e`) with the chart installed (`operator_release`): each test trains a
small PetsTraining in a fresh namespace (`trainings`) with its outputs on a ReadWriteMany claim
(`shared_output`), then fetches them back through the client.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from trainings import (
    GROUP,
    PLURAL,
    REPO,
    SMALL_SPEC,
    TRAIN_TIMEOUT_S,
    VERSION,
    Trainings,
    cluster_kubeconfig,
    digits_by_class,
)

pytestmark = pytest.mark.e2e

NOTEBOOK = REPO / "examples" / "train-from-python.ipynb"



def kubectl_pets(*args: str, timeout: float = TRAIN_TIMEOUT_S + 120) -> subprocess.CompletedProcess[str]:
    """`kubectl pets ...` as a user runs it: kubectl finds the kubectl-pets plugin on PATH."""
    bin_dir = Path(sys.executable).parent  # the venv's bin, where pip put kubectl-pets
    env = {**os.environ, "KUBECONFIG": str(cluster_kubeconfig()),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["kubectl", "pets", *args], env=env, text=True, capture_output=True,
                          timeout=timeout, check=False)


def test_notebook_trains_and_shows_the_metrics(trainings: Trainings, shared_output: str,
                                               monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import nbformat
    from nbclient import NotebookClient

    # The kernel inherits this environment: the notebook's parameters cell reads it.
    monkeypatch.setenv("PETS_NAMESPACE", trainings.namespace)
    monkeypatch.setenv("PETS_OUTPUT_CLAIM", shared_output)
    monkeypatch.setenv("PETS_TIMEOUT", str(TRAIN_TIMEOUT_S))
    monkeypatch.setenv("KUBECONFIG", str(cluster_kubeconfig()))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    runner = NotebookClient(nb, timeout=TRAIN_TIMEOUT_S + 300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    try:
        runner.execute()
    finally:
        nbformat.write(nb, tmp_path / "executed.ipynb")  # kept by pytest's tmp_path, for debugging

    items = trainings.custom.list_namespaced_custom_object(
        GROUP, VERSION, trainings.namespace, PLURAL)["items"]
    assert len(items) == 1, [i["metadata"]["name"] for i in items]
    status = items[0].get("status") or {}
    assert status.get("phase") == "Succeeded", status
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    pngs = [o for o in outputs if "image/png" in (o.get("data") or {})]
    assert pngs, "no output cell holds an image/png (the fetched metrics.png)"
    text = "".join(o.get("text", "") for o in outputs)
    assert "phase Succeeded, eval accuracy" in text, text[-3000:]


def test_kubectl_pets_run_watch_fetch_plot_logs(trainings: Trainings, shared_output: str,
                                                tmp_path: Path) -> None:
    name = "cli"
    manifest = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PetsTraining", "metadata": {"name": name},
                "spec": {**SMALL_SPEC, "output": {"persistentVolumeClaim": {"claimName": shared_output}}}}
    path = tmp_path / "petstraining.yaml"
    path.write_text(yaml.safe_dump(manifest))
    ns = ["-n", trainings.namespace]

    run = kubectl_pets("run", "-f", str(path), "--watch", *ns)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{trainings.describe(name)}"
    assert f"petstraining.training.pets.dev/{name} created" in run.stdout, run.stdout
    assert "final accuracy: " in run.stdout, run.stdout
    status = trainings.status(name)
    assert status["phase"] == "Succeeded", status
    printed = float(run.stdout.rsplit("final accuracy: ", 1)[1].split()[0])
    assert abs(printed - status["summary"]["final_accuracy"]) < 1e-4, (printed, status["summary"])

    out = tmp_path / "out"
    fetched = kubectl_pets("fetch", name, str(out), *ns, timeout=600)
    assert fetched.returncode == 0, f"{fetched.stdout}\n{fetched.stderr}"
    assert (out / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "model.safetensors").stat().st_size > 1_000_000
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["epochs"] == SMALL_SPEC["epochs"], summary
    fetch_pods = trainings.core.list_namespaced_pod(
        trainings.namespace, label_selector="app.kubernetes.io/component=fetch").items
    assert all(p.metadata.deletion_timestamp for p in fetch_pods), "the fetch pod was left behind"

    plot = kubectl_pets("plot", name, "--out", str(tmp_path / "curves.png"), *ns, timeout=600)
    assert plot.returncode == 0, f"{plot.stdout}\n{plot.stderr}"
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    logs = kubectl_pets("logs", name, "--rank", "1", *ns, timeout=120)
    assert logs.returncode == 0, logs.stderr
    assert "machine 1 of 2" in logs.stdout, logs.stdout[-3000:]

    listed = kubectl_pets("list", *ns, timeout=60)
    assert listed.stdout.splitlines()[1].split()[:2] == [name, "Succeeded"], listed.stdout


def test_kubectl_pets_upload_then_run_data_watch_and_fetch_the_report(trainings: Trainings,
                                                                      shared_output: str,
                                                                      tmp_path: Path) -> None:
    """A folder of the user's images goes in with `kubectl pets upload`, a second upload (by `run --data`)
    copies nothing, the training reads the folder-per-class layout with its mixed image kinds, and the
    dataset report comes back in status, on the watch, and as dataset.json."""
    data = digits_by_class(tmp_path / "digits", 40)
    ns = ["-n", trainings.namespace]
    first = kubectl_pets("upload", str(data), "--claim", "digits", *ns, timeout=900)
    assert first.returncode == 0, f"{first.stdout}\n{first.stderr}"
    assert "copied 401 files" in first.stdout and "(new claim), skipped 0" in first.stdout, first.stdout

    name = "digits"
    spec = {k: v for k, v in SMALL_SPEC.items() if k != "dataset"}
    manifest = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PetsTraining", "metadata": {"name": name},
                "spec": {**spec, "output": {"persistentVolumeClaim": {"claimName": shared_output}}}}
    path = tmp_path / "petstraining.yaml"
    path.write_text(yaml.safe_dump(manifest))
    run = kubectl_pets("run", "-f", str(path), "--data", str(data), "--claim", "digits", "--watch", *ns)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{trainings.describe(name)}"
    assert "copied 0 files / 0 B into claim digits, skipped 401 already there" in run.stdout, run.stdout
    assert (f"{name}: dataset: 400 images in 10 classes, 1 file skipped (dataset.json in the output names "
            "them); 320 for training, 80 for evaluation") in run.stdout, run.stdout
    status = trainings.status(name)
    assert status["phase"] == "Succeeded", status
    assert status["dataset"] == {"layout": "imagefolder", "images": 400, "classes": 10, "skipped": 1,
                                 "trainImages": 320, "evalImages": 80}, status
    claim = trainings.get(name)["spec"]["dataset"]["persistentVolumeClaim"]
    assert (claim["claimName"], claim["path"]) == ("digits", "/"), claim

    out = tmp_path / "out"
    fetched = kubectl_pets("fetch", name, str(out), *ns, timeout=600)
    assert fetched.returncode == 0, f"{fetched.stdout}\n{fetched.stderr}"
    report = json.loads((out / "dataset.json").read_text())
    assert report["per_class"] == {f"digit_{d}": 40 for d in range(10)}, report
    (broken,) = report["skipped_files"]
    assert broken["file"] == "digit_0/scan_broken.jpg" and broken["reason"].startswith("unreadable ("), report
    uploads = trainings.core.list_namespaced_pod(
        trainings.namespace, label_selector="app.kubernetes.io/component=upload").items
    assert all(p.metadata.deletion_timestamp for p in uploads), "an upload pod was left behind"


def test_kubectl_pets_fetch_says_why_an_emptydir_cannot_be_fetched(trainings: Trainings,
                                                                   tmp_path: Path) -> None:
    trainings.create("scratch", {**SMALL_SPEC, "suspend": True, "output": {"emptyDir": {}}})
    result = kubectl_pets("fetch", "scratch", str(tmp_path), "-n", trainings.namespace, timeout=60)
    assert result.returncode == 1
    assert "emptyDir" in result.stderr and "spec.output.persistentVolumeClaim" in result.stderr, result.stderr


def test_a_folder_of_5000_tiny_files_uploads_within_its_deadline_and_again_copies_nothing(
        trainings: Trainings, tmp_path: Path) -> None:
    """Many small files are the slow case of a transfer that costs something per file (one exec each
    once did 4.5 files/s): they go in batches of one tar stream each, inside the upload pod's deadline
    (which grows with files as well as bytes), and a second upload lists them and copies nothing."""
    from pets_client.upload import pod_lifetime

    folder = tmp_path / "tiny"
    for i in range(5000):
        path = folder / f"class_{i % 10}" / f"file_{i}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{i}\n")
    ns = ["-n", trainings.namespace]
    started = time.monotonic()
    deadline = pod_lifetime(23_890, 5000)  # the files' bytes
    first = kubectl_pets("upload", str(folder), "--claim", "tiny", *ns, timeout=deadline)
    took = time.monotonic() - started
    assert first.returncode == 0, f"{first.stdout}\n{first.stderr}"
    assert "copied 5000 files / 23.9 kB into claim tiny (new claim), skipped 0" in first.stdout, first.stdout
    print(f"5000 tiny files uploaded in {took:.1f} s ({5000 / took:.0f} files/s); "
          f"the upload pod's deadline: {deadline} s")
    again = kubectl_pets("upload", str(folder), "--claim", "tiny", *ns, timeout=600)
    assert again.returncode == 0, f"{again.stdout}\n{again.stderr}"
    assert "copied 0 files / 0 B into claim tiny, skipped 5000 already there" in again.stdout, again.stdout
    claim = trainings.core.read_namespaced_persistent_volume_claim("tiny", trainings.namespace)
    root = Path(trainings.core.read_persistent_volume(claim.spec.volume_name).spec.host_path.path)
    copied = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert copied == sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert (root / "class_7" / "file_4567.txt").read_text() == "4567\n"
