"""The client's pure parts: building the PetsTraining, pod selectors, the fetch pod, the bar's state."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pets_client import InvalidTrainingError, LogsError, build_training
from pets_client import _api as client_api
from pets_client.client import _Reporter, pod_selector
from pets_client.errors import FetchError, server_error
from pets_client.progress import BarState, bar_state, dataset_line, final_line, phase_line, postfix
from pets_client.transfer import (
    CHUNK_BYTES,
    assemble,
    chunk_command,
    decode_chunk,
    fetch_pod,
    list_request,
    output_claim,
    parse_list,
    save,
)

pytestmark = pytest.mark.unit


def test_importing_the_client_does_not_import_torch() -> None:
    code = ("import sys, pets_client, pets_client.cli, pets_client.plot, pets_client.progress\n"
            "heavy = sorted(m for m in ('torch', 'pets_training', 'pets_operator', 'kopf', 'matplotlib')\n"
            "               if m in sys.modules)\n"
            "print(','.join(heavy))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import pets_client imported {out.stdout.strip()}"


def test_the_client_finds_the_trainer_containers_and_rank_0_the_operator_makes() -> None:
    from pets_operator import backends, builders

    assert builders.CONTAINER in client_api.TRAINER_CONTAINERS
    assert backends.PyTorchJobBackend.container in client_api.TRAINER_CONTAINERS
    # the client's selector picks the pods the operator calls rank 0 of that Job
    selector = pod_selector({"job": "pets"}, 0)
    labels = dict(term.split("=", 1) for term in selector.split(","))
    assert backends.JOB.pods_selector("pets") in selector.split(",")
    assert backends.JOB.rank_of({"metadata": {"labels": labels}}) == 0


# ----------------------------------------------------------------------------- build_training


def test_build_from_keywords_generates_a_name() -> None:
    body = build_training(epochs=2, batch_size=16, mixedPrecision="bf16")
    assert body == {"apiVersion": "training.pets.dev/v1alpha1", "kind": "PetsTraining",
                    "metadata": {"generateName": "pets-"},
                    "spec": {"epochs": 2, "batchSize": 16, "mixedPrecision": "bf16"}}


def test_build_from_a_spec_dict_and_a_name() -> None:
    spec = {"epochs": 2, "dataset": {"synthetic": {"numClasses": 4}}}
    body = build_training(spec, name="pets", replicas=2)
    assert body["metadata"] == {"name": "pets"}
    assert body["spec"] == {"epochs": 2, "dataset": {"synthetic": {"numClasses": 4}}, "replicas": 2}
    assert spec == {"epochs": 2, "dataset": {"synthetic": {"numClasses": 4}}}, "the caller's dict changed"


def test_build_from_a_manifest() -> None:
    manifest = {"apiVersion": "training.pets.dev/v1alpha1", "kind": "PetsTraining",
                "metadata": {"name": "from-file", "labels": {"team": "a"}}, "spec": {"epochs": 3}}
    body = build_training(manifest, epochs=1)
    assert body["metadata"] == {"name": "from-file", "labels": {"team": "a"}}
    assert body["spec"] == {"epochs": 1}
    assert build_training(manifest, name="other")["metadata"]["name"] == "other"
    assert build_training({"metadata": {"generateName": "x-"}})["metadata"] == {"generateName": "x-"}
    assert build_training({"kind": "PetsTraining", "spec": None})["spec"] == {}


@pytest.mark.parametrize(("manifest", "field"), [
    ({"kind": "Job", "spec": {}}, "kind"),
    ({"apiVersion": "training.pets.dev/v1", "spec": {}}, "apiVersion"),
    ({"metadata": {"namespace": "other"}, "spec": {}}, "metadata.namespace"),
])
def test_build_refuses_a_foreign_manifest(manifest: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidTrainingError) as err:
        build_training(manifest, namespace="mine")
    assert err.value.fields == [field] and field in str(err.value)


def test_server_error_carries_the_message_and_the_fields() -> None:
    class Exc:
        status = 422
        reason = "Unprocessable Entity"
        body = ('{"kind":"Status","message":"PetsTraining.training.pets.dev \\"x\\" is invalid: '
                'spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal '
                'to 1",'
                '"details":{"causes":[{"reason":"FieldValueInvalid","message":"...","field":"spec.replicas"}]}}')

    message, fields, causes = server_error(Exc())
    assert "spec.replicas: Invalid value: 0" in message and fields == ["spec.replicas"] and len(causes) == 1
    Exc.body = "not json"
    assert server_error(Exc())[0] == "Unprocessable Entity"


# ----------------------------------------------------------------------------- pods


def test_pod_selectors_of_each_backend() -> None:
    assert pod_selector({"job": "pets-r1", "service": "pets"}, 1) == (
        "job-name=pets-r1,batch.kubernetes.io/job-completion-index=1")
    assert pod_selector({"pytorchJob": "pets"}, 0) == (
        "training.kubeflow.org/job-name=pets,training.kubeflow.org/replica-type=master,"
        "training.kubeflow.org/replica-index=0")
    assert pod_selector({"pytorchJob": "pets"}, 3).endswith("replica-type=worker,"
                                                            "training.kubeflow.org/replica-index=2")
    with pytest.raises(LogsError, match="no workload yet"):
        pod_selector({}, 0)
    with pytest.raises(LogsError, match="rank"):
        pod_selector({"job": "pets"}, -1)


def test_the_fetch_pod_mounts_the_claim_read_only() -> None:
    training = {"metadata": {"name": "pets"}, "spec": {
        "output": {"persistentVolumeClaim": {"claimName": "out", "path": "/runs/1/"}},
        "nodeSelector": {"pool": "cpu"}, "tolerations": [{"operator": "Exists"}]}}
    pod = fetch_pod(training, "img:1", ["summary.json"])
    spec = pod["spec"]
    (c,) = spec["containers"]
    assert c["image"] == "img:1" and c["imagePullPolicy"] == "IfNotPresent"
    assert c["volumeMounts"] == [{"name": "output", "mountPath": "/output", "readOnly": True,
                                  "subPath": "runs/1"}]
    assert spec["volumes"] == [{"name": "output", "persistentVolumeClaim": {"claimName": "out",
                                                                           "readOnly": True}}]
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] > 0
    assert spec["automountServiceAccountToken"] is False
    # The trainer's uid (it writes model.safetensors 0600), above every host user's (checkov CKV_K8S_40).
    assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                       "seccompProfile": {"type": "RuntimeDefault"}}
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}}
    assert spec["nodeSelector"] == {"pool": "cpu"} and spec["tolerations"] == [{"operator": "Exists"}]
    assert pod["metadata"]["generateName"] == "pets-fetch-"
    assert "training.pets.dev/training" not in pod["metadata"]["labels"], "the operator's children label"
    root = fetch_pod({"metadata": {"name": "p"}, "spec": {"output": {"persistentVolumeClaim": {
        "claimName": "out"}}}}, "img", [])
    assert "subPath" not in root["spec"]["containers"][0]["volumeMounts"][0]


def test_the_fetch_pod_mounts_the_claim_the_operator_made_for_a_managed_output() -> None:
    training = {"metadata": {"name": "pets"}, "spec": {"output": {"managedClaim": {"size": "1Gi"}}}}
    assert output_claim(training) == {"claimName": "pets-output"}
    pod = fetch_pod(training, "img:1", ["summary.json"])
    assert pod["spec"]["volumes"] == [{"name": "output", "persistentVolumeClaim": {"claimName": "pets-output",
                                                                                  "readOnly": True}}]
    assert output_claim({"metadata": {"name": "pets"}, "spec": {"output": {"emptyDir": {}}}}) is None


def test_an_unset_output_is_what_the_operator_chose() -> None:
    chose = {"metadata": {"name": "pets"}, "spec": {},
             "status": {"output": {"managedClaim": {"size": "5Gi"}}, "outputReason": "OperatorDefault"}}
    assert output_claim(chose) == {"claimName": "pets-output"}
    fell_back = {"metadata": {"name": "pets"}, "spec": {},
                 "status": {"output": {"emptyDir": {}}, "outputReason": "NoDefaultStorageClass"}}
    assert output_claim(fell_back) is None
    # The spec wins over an old choice; a training the operator has not seen has no claim yet.
    assert output_claim(chose | {"spec": {"output": {"emptyDir": {}}}}) is None
    assert output_claim({"metadata": {"name": "pets"}, "spec": {}}) is None


def test_fetch_commands_refuse_paths_outside_the_output() -> None:
    for bad in ("../etc/passwd", "/etc/passwd", "a;rm -rf /", "$(x)"):
        with pytest.raises(FetchError):
            chunk_command(bad, 0)


def _run_in(directory: Path, cmd: list[str], stdin: bytes = b"") -> bytes:
    """A fetch pod command run here, with ``directory`` standing in for /output."""
    res = subprocess.run([cmd[0], cmd[1], cmd[2], str(directory), *cmd[4:]], input=stdin, capture_output=True,
                         check=False)
    assert res.returncode == 0 and not res.stderr, res.stderr
    return res.stdout


def _list_in(directory: Path, names: list[str]) -> list[tuple[str, int, str]]:
    command, text, _ = list_request("/output", names)
    return parse_list(_run_in(directory, command, text))


def test_the_listing_never_runs_a_name(tmp_path: Path) -> None:
    """The names go to the pod on stdin, never into its shell's command line."""
    (tmp_path / "a b").write_text("x")
    names = ["$(touch pwned)", "`touch pwned`", "a b", "; touch pwned", "-n", "--help"]
    assert [(n, size) for n, size, _ in _list_in(tmp_path, names)] == [("a b", 1)]
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_the_pod_commands_list_and_read_a_file_in_checked_chunks(tmp_path: Path) -> None:
    payload = os.urandom(CHUNK_BYTES * 2 + 12345)
    (tmp_path / "model.safetensors").write_bytes(payload)
    (tmp_path / "summary.json").write_text("{}")
    listing = _list_in(tmp_path, ["summary.json", "metrics.png", "model.safetensors"])
    assert [(n, size) for n, size, _ in listing] == [("summary.json", 2), ("model.safetensors", len(payload))]
    name, size, digest = listing[1]
    assert digest == hashlib.sha256(payload).hexdigest()
    got = assemble(name, size, digest, lambda i: decode_chunk(_run_in(tmp_path, chunk_command(name, i))))
    assert got == payload
    assert save(tmp_path / "dest", name, got).read_bytes() == payload


def test_a_short_chunk_is_read_again_and_a_wrong_digest_refused() -> None:
    payload = b"x" * (CHUNK_BYTES + 10)
    digest = hashlib.sha256(payload).hexdigest()
    reads: list[int] = []

    def flaky(index: int) -> bytes:  # what a dropped websocket frame looks like: a short chunk
        reads.append(index)
        chunk = payload[index * CHUNK_BYTES:(index + 1) * CHUNK_BYTES]
        return chunk[:-32768] if reads.count(index) == 1 else chunk

    assert assemble("model.safetensors", len(payload), digest, flaky) == payload
    assert reads == [0, 0, 1, 1]
    with pytest.raises(FetchError, match="came back with 0 of"):
        assemble("m", len(payload), digest, lambda i: b"")
    with pytest.raises(FetchError, match="does not match its sha256"):
        assemble("m", len(payload), "0" * 64, lambda i: payload[i * CHUNK_BYTES:(i + 1) * CHUNK_BYTES])
    assert decode_chunk(base64.b64encode(b"abc")[:-1]) == b""  # not whole base64: read again


def test_bar_counts_steps_when_reported() -> None:
    status = {"phase": "Running", "epoch": 1, "totalEpochs": 2, "step": 7, "stepsTotal": 20,
              "trainLoss": 1.23456, "evalAccuracy": 0.8125, "imagesPerSecond": 123.456}
    assert bar_state(status) == BarState(7, 20, "step", {"loss": "1.2346", "acc": "81.2%", "img/s": "123.5"},
                                         "epoch 2/2")


def test_bar_has_no_total_before_steps_are_reported_and_is_full_at_succeeded() -> None:
    assert bar_state({"epoch": 1, "totalEpochs": 5, "trainLoss": 2.0}) == \
        BarState(0, None, "step", {"loss": "2.0000"}, "epoch 2/5")
    assert bar_state({"phase": "Pending"}) == BarState(0, None, "step", {})
    assert bar_state({"step": 30, "stepsTotal": 20}).n == 20
    done = bar_state({"phase": "Succeeded", "epoch": 3, "totalEpochs": 3, "step": 4, "stepsTotal": 6})
    assert (done.n, done.total, done.desc) == (6, 6, "epoch 3/3")
    assert postfix({"trainLoss": "nan?", "evalAccuracy": None, "imagesPerSecond": True}) == {}


def test_the_dataset_line_is_said_once_when_the_report_arrives() -> None:
    report = {"images": 1796, "classes": 10, "skipped": 1, "trainImages": 1436, "evalImages": 360}
    running = {"phase": "Running", "dataset": report}
    assert dataset_line("pets", {"phase": "Running"}, running) == (
        "pets: dataset: 1796 images in 10 classes, 1 file skipped (dataset.json in the output names them); "
        "1436 for training, 360 for evaluation")
    assert dataset_line("pets", running, {**running, "epoch": 1}) is None  # said once
    assert dataset_line("pets", None, {"phase": "Running"}) is None
    clean = {"dataset": {"images": 40, "classes": 2}}
    assert dataset_line("pets", None, clean) == "pets: dataset: 40 images in 2 classes"
    assert dataset_line("pets", None, {"dataset": "junk"}) is None


def test_phase_lines_print_only_changes() -> None:
    pending = {"phase": "Pending", "message": "0/1 nodes are available: Insufficient cpu"}
    assert phase_line("pets", None, pending) == "pets: Pending: 0/1 nodes are available: Insufficient cpu"
    assert phase_line("pets", pending, {**pending, "step": 3}) is None
    assert phase_line("pets", pending, {"phase": "Running"}) == "pets: Running"
    assert phase_line("pets", None, {}) is None


def test_final_line() -> None:
    ok = {"phase": "Succeeded", "epoch": 2, "totalEpochs": 2, "evalAccuracy": 0.5,
          "summary": {"final_accuracy": 0.875}, "message": "done"}
    assert final_line("pets", ok) == "pets: Succeeded, final accuracy 0.8750 (87.5%), epoch 2/2"
    assert final_line("pets", {"phase": "Failed", "message": "unknown model"}) == (
        "pets: Failed, unknown model")
    restarted = {**ok, "goodput": {"ratio": 0.5833, "wallSeconds": 120.0, "lostSeconds": 10.0}}
    assert final_line("pets", restarted) == ("pets: Succeeded, final accuracy 0.8750 (87.5%), epoch 2/2, "
                                             "goodput 58% of 120 s (10 s of work lost to restarts)")
    assert final_line("pets", {**ok, "goodput": {"ratio": 0.9, "wallSeconds": 60.0, "lostSeconds": 0.0}}) \
        .endswith("epoch 2/2, goodput 90% of 60 s")


def test_reporter_draws_the_bar_and_the_lines() -> None:
    out = io.StringIO()
    rep = _Reporter("pets", True, out)
    rep.update({"phase": "Pending", "message": "waiting for the Job's pods"})
    rep.update({"phase": "Running", "epoch": 0, "totalEpochs": 2})
    rep.update({"phase": "Running", "epoch": 1, "totalEpochs": 2, "step": 5, "stepsTotal": 10,
                "trainLoss": 0.5, "evalAccuracy": 0.25, "imagesPerSecond": 10})
    final = {"phase": "Succeeded", "epoch": 2, "totalEpochs": 2, "step": 10, "stepsTotal": 10,
             "evalAccuracy": 0.75}
    rep.update(final)
    rep.close(final)
    text = out.getvalue()
    assert "pets: Pending: waiting for the Job's pods" in text
    assert "5/10" in text and "loss=0.5000" in text and "acc=25.0%" in text and "img/s=10.0" in text
    assert "10/10" in text
    assert text.rstrip().endswith("pets: Succeeded, final accuracy 0.7500 (75.0%), epoch 2/2")
    quiet = io.StringIO()
    rep = _Reporter("pets", False, quiet)
    rep.update(final)
    rep.close(final)
    assert quiet.getvalue() == ""
