"""End to end: a training's work outlives its pods by default, on the claim the operator makes.

The local cluster's default class is `pets-shared` (tests/cluster/storage.sh: local-path on a directory
every node sees, so ReadWriteMany works across nodes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from polling import wait_for
from trainings import (
    GROUP,
    PLURAL,
    POLL_S,
    REPO,
    SMALL_SPEC,
    VERSION,
    Trainings,
    cluster_kubeconfig,
    kubectl,
    pod_logs,
    pod_of_rank,
)

pytestmark = pytest.mark.e2e

SAMPLE = REPO / "petstraining.yaml"
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"


def kubectl_pets(*args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl pets ...` as a user runs it: kubectl finds the kubectl-pets plugin on PATH."""
    env = {**os.environ, "KUBECONFIG": str(cluster_kubeconfig()),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["kubectl", "pets", *args], env=env, text=True, capture_output=True, timeout=300,
                          check=False)


def claims(trainings: Trainings) -> dict[str, Any]:
    return {c.metadata.name: c for c in trainings.core.list_namespaced_persistent_volume_claim(
        trainings.namespace).items}


def bound_claim(trainings: Trainings, name: str) -> Any:
    return wait_for(f"claim {name} Bound",
                    lambda: (c := claims(trainings).get(name)) and c.status.phase == "Bound" and c,
                    120, POLL_S)


def condition(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions") or [] if c["type"] == ctype)


def test_the_sample_as_it_is_resumes_after_an_eviction_and_its_results_can_be_fetched(
        trainings: Trainings, tmp_path: Path) -> None:
    """petstraining.yaml, applied as it is in the repository (no spec.output), is evicted after its first
    checkpoint: the new attempt resumes from it, and `kubectl pets fetch` / `plot` get the results."""
    (sample,) = yaml.safe_load_all(SAMPLE.read_text())
    assert "output" not in sample["spec"], "the sample is meant to show the default output"
    name, epochs = sample["metadata"]["name"], sample["spec"]["epochs"]
    kubectl("-n", trainings.namespace, "apply", "-f", str(SAMPLE))

    claim = bound_claim(trainings, f"{name}-output")
    assert claim.spec.access_modes == ["ReadWriteMany"], claim.spec  # the sample's two pods mount it
    assert [(r.kind, r.name) for r in claim.metadata.owner_references] == [("PetsTraining", name)]

    # Evict once epoch 2 has begun: epoch 1's checkpoint is complete by then (it is saved before the
    # next epoch starts), and the sample's short epochs leave no time for status.lastCheckpoint's lag.
    def rank0_in_epoch_2() -> Any:
        if trainings.status(name).get("phase") == "Succeeded":
            pytest.fail(f"{name} finished before it could be evicted mid-run")
        pods = [p for p in trainings.pods(name) if p.status.phase == "Running"]
        rank0 = pod_of_rank(pods, 0) if len(pods) == 2 else None
        return rank0 if rank0 and f"epoch 1/{epochs}:" in pod_logs(trainings.namespace,
                                                                    rank0.metadata.name) else None

    rank0 = wait_for(f"{name}: rank 0 past epoch 1", rank0_in_epoch_2, 600, 0.5)
    # A step read into status, so the restart can say how far the attempt got (lastFailure.lastStep).
    wait_for(f"{name}: status.step", lambda: trainings.status(name).get("step"), 60, 0.5)
    trainings.evict(rank0)
    restarted = wait_for(f"{name}: a gang restart for the eviction",
                         lambda: (s := trainings.status(name)).get("restarts", 0) >= 1 and s, 300, 0.5)
    # Evicted or Disrupted (the eviction, as the pod or the Job says it), or Stopped (its peer's exit 75,
    # when that failed the Job first): none counts.
    assert restarted["lastFailure"]["cause"] in ("Evicted", "Disrupted", "Stopped"), restarted["lastFailure"]
    # "resuming at step N" (the step rank 0 saved on the eviction's SIGTERM) or "resuming from" a
    # checkpoint: never "starting from epoch 0".
    assert "resuming" in restarted["message"] and "epoch 0" not in restarted["message"], restarted

    status = trainings.wait_phase(name, "Succeeded")
    assert (status["restarts"], status["disruptions"]) == (1, 1), status
    # The eviction's SIGTERM: every rank finished its step and saved, so at most the step in flight is
    # done again (lostSteps: the step last read minus the step the next attempt resumed at).
    print(f"eviction: lastFailure {status['lastFailure']}, resumeStep {status.get('resumeStep')}")
    assert status["lastFailure"]["lostSteps"] <= 1, status["lastFailure"]
    # Goodput: both attempts' parts, the eviction's lost step among them; the parts add up to the wall
    # time, and the trainer's and the operator's clocks do not overlap (unaccounted is not negative
    # beyond 1 %: the parts are disjoint, as defined).
    book = status["goodput"]
    print(f"eviction: goodput {json.dumps(book)}")
    assert [a["attempt"] for a in book["attempts"]] == [0, 1], book
    assert book["attempts"][0]["lostSteps"] == status["lastFailure"]["lostSteps"], book
    parts = [book[k] for k in ("waitingSeconds", "startupSeconds", "productiveSeconds", "lostSeconds",
                               "evalSeconds", "checkpointSeconds", "restoreSeconds", "unaccountedSeconds")]
    assert sum(parts) == pytest.approx(book["wallSeconds"], rel=0.01), book
    assert book["unaccountedSeconds"] >= -0.01 * book["wallSeconds"], book
    assert 0 < book["ratio"] < 1 and book["productiveSeconds"] > 0, book
    assert (condition(status, "OutputDurable")["status"], condition(status, "OutputDurable")["reason"]) == \
        ("True", "ManagedClaim"), status["conditions"]
    resumed = pod_logs(trainings.namespace, pod_of_rank(trainings.pods(name), 0).metadata.name)
    # After epoch N from an epoch checkpoint, or at the step it saved on the eviction's SIGTERM.
    assert "resume: continuing" in resumed, resumed[-3000:]
    assert "starting fresh" not in resumed, resumed[-3000:]

    ns = ["-n", trainings.namespace]
    fetched = kubectl_pets("fetch", name, str(tmp_path / "out"), *ns)
    assert fetched.returncode == 0, f"{fetched.stdout}\n{fetched.stderr}"
    model = tmp_path / "out" / "model.safetensors"
    assert model.stat().st_size > 1_000_000, model.stat()  # resnet18's weights
    plotted = kubectl_pets("plot", name, "--out", str(tmp_path / "curves.png"), *ns)
    assert plotted.returncode == 0, f"{plotted.stdout}\n{plotted.stderr}"
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    trainings.custom.delete_namespaced_custom_object(GROUP, VERSION, trainings.namespace, PLURAL, name)
    wait_for(f"the garbage collector to delete {name}-output with its training",
             lambda: f"{name}-output" not in claims(trainings), 120, POLL_S)


def test_a_retained_claim_outlives_its_training(trainings: Trainings) -> None:
    name = "kept"
    trainings.create(name, {**SMALL_SPEC, "suspend": True,
                            "output": {"managedClaim": {"retentionPolicy": "Retain", "size": "1Gi"}}})
    claim = bound_claim(trainings, f"{name}-output")
    assert not claim.metadata.owner_references, claim.metadata
    assert claim.metadata.labels["training.pets.dev/output-retention"] == "Retain"
    assert claim.spec.resources.requests["storage"] == "1Gi"
    events = wait_for(f"{name}: the OutputClaimRetained Event", lambda: [
        e for e in trainings.core.list_namespaced_event(
            trainings.namespace, field_selector=f"involvedObject.name={name}").items
        if e.reason == "OutputClaimRetained"], 60, POLL_S)
    how = f"kubectl delete pvc -n {trainings.namespace} {name}-output"
    assert how in events[0].message, events[0].message

    trainings.custom.delete_namespaced_custom_object(GROUP, VERSION, trainings.namespace, PLURAL, name)
    wait_for(f"{name} gone", lambda: not trainings.custom.list_namespaced_custom_object(
        GROUP, VERSION, trainings.namespace, PLURAL)["items"], 60, POLL_S)
    wait_for(f"{name}'s Job gone (the garbage collector at work)", lambda: not trainings.jobs(name), 60,
             POLL_S)
    kept = claims(trainings).get(f"{name}-output")
    assert kept is not None and not kept.metadata.deletion_timestamp, "a Retain claim went with its training"


@pytest.fixture
def no_default_class(trainings: Trainings) -> Iterator[list[str]]:
    """The cluster without a default StorageClass: the annotation taken off every default class, and put
    back afterwards (a training the operator saw meanwhile keeps its emptyDir: status.output, unit-tested
    in tests/unit/operator/test_operator_output.py)."""
    from kubernetes import client

    storage = client.StorageV1Api(trainings.core.api_client)
    defaults = [sc.metadata.name for sc in storage.list_storage_class().items
                if (sc.metadata.annotations or {}).get(DEFAULT_CLASS_ANNOTATION) == "true"]
    assert defaults, "the local cluster has a default StorageClass (tests/cluster/storage.sh)"
    try:
        for sc in defaults:
            kubectl("annotate", "storageclass", sc, f"{DEFAULT_CLASS_ANNOTATION}=false", "--overwrite")
        yield defaults
    finally:
        for sc in defaults:
            kubectl("annotate", "storageclass", sc, f"{DEFAULT_CLASS_ANNOTATION}=true", "--overwrite")


def test_without_a_default_storage_class_the_output_is_an_emptydir_and_the_status_says_so(
        trainings: Trainings, no_default_class: list[str]) -> None:
    name = "nowhere"
    started = time.monotonic()
    trainings.create(name, {**SMALL_SPEC, "suspend": True})
    status = wait_for(f"{name}: OutputDurable", lambda: (s := trainings.status(name)).get("output") and s,
                      60, 0.5)
    print(f"OutputDurable written {time.monotonic() - started:.1f} s after the create")
    assert (status["output"], status["outputReason"]) == ({"emptyDir": {}}, "NoDefaultStorageClass"), status
    durable = condition(status, "OutputDurable")
    assert (durable["status"], durable["reason"]) == ("False", "NoDefaultStorageClass"), durable
    assert "starts from epoch 0" in durable["message"], durable
    assert "default StorageClass" in durable["message"], durable
    (job,) = wait_for(f"{name}'s Job", lambda: trainings.jobs(name), 60, POLL_S)
    volumes = {v.name: v for v in job.spec.template.spec.volumes}
    assert volumes["output"].empty_dir is not None and volumes["output"].persistent_volume_claim is None
    assert f"{name}-output" not in claims(trainings)
