"""End to end: spec.output.managedClaim, the claim the operator makes, on the cluster's default StorageClass.

The local cluster's default class is `pets-shared` (tests/cluster/storage.sh: local-path on a directory
every node sees, so ReadWriteMany works across nodes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from polling import wait_for
from trainings import (
    GROUP,
    LONGER_SPEC,
    PLURAL,
    POLL_S,
    VERSION,
    Trainings,
    cluster_kubeconfig,
    pod_logs,
    pod_of_rank,
)

pytestmark = pytest.mark.e2e


def test_a_managed_claim_keeps_the_work_through_an_eviction_and_goes_with_the_training(
        trainings: Trainings, tmp_path: Path) -> None:
    from pets_client import PetsTrainingClient

    name = "managed"
    # maxRestarts 0: an eviction is the cluster's doing and must not count.
    trainings.create(name, {**LONGER_SPEC, "epochs": 3, "maxRestarts": 0, "output": {"managedClaim": {}}})
    def claims() -> dict[str, Any]:
        return {c.metadata.name: c for c in trainings.core.list_namespaced_persistent_volume_claim(
            trainings.namespace).items}

    claim = wait_for(f"claim {name}-output Bound",
                     lambda: (c := claims().get(f"{name}-output")) and c.status.phase == "Bound" and c,
                     120, POLL_S)
    assert claim.spec.access_modes == ["ReadWriteMany"], claim.spec  # two pods mount it
    assert [(r.kind, r.name) for r in claim.metadata.owner_references] == [("PetsTraining", name)]
    wait_for(f"{name} status.lastCheckpoint", lambda: (trainings.status(name).get("lastCheckpoint") or {})
             .get("epoch"), 600, POLL_S)

    trainings.evict(pod_of_rank(trainings.pods(name), 0))
    status = trainings.wait_phase(name, "Succeeded")
    assert (status["restarts"], status["disruptions"]) == (1, 1), status
    durable = next(c for c in status["conditions"] if c["type"] == "OutputDurable")
    assert (durable["status"], durable["reason"]) == ("True", "ManagedClaim"), durable
    resumed = pod_logs(trainings.namespace, pod_of_rank(trainings.pods(name), 0).metadata.name)
    assert "resume: continuing after epoch" in resumed, resumed[-3000:]

    pets = PetsTrainingClient(namespace=trainings.namespace, kubeconfig=cluster_kubeconfig())
    got = {p.name for p in pets.fetch(name, tmp_path / "out")}
    assert {"model.safetensors", "summary.json", "progress.jsonl"} <= got, got
    assert pets.plot(name, tmp_path / "curves.png").stat().st_size > 0

    trainings.custom.delete_namespaced_custom_object(GROUP, VERSION, trainings.namespace, PLURAL, name)
    wait_for(f"the garbage collector to delete {name}-output with its training",
             lambda: f"{name}-output" not in claims(), 120, POLL_S)
