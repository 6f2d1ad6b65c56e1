"""spec.activeDeadlineSeconds is the training's (issue 21), against a real API server: with the Job
controller off, nothing fails the Job by itself, so the operator's own clock must end the training when
its deadline runs out: Failed/DeadlineExceeded, no restart, the Job deleted, no second Job."""

from __future__ import annotations

import pytest
from conftest import OperatorThread, wait_for
from kubernetes import client
from test_operator_lifecycle import create_training, jobs, run_job, the_job, wait_phase

pytestmark = pytest.mark.integration


def test_the_operator_ends_a_running_training_when_its_deadline_runs_out(
        admin: client.ApiClient, operator: OperatorThread, namespace: str) -> None:
    create_training(admin, namespace, "late", replicas=2, activeDeadlineSeconds=10, maxRestarts=3)
    job = the_job(admin, namespace, "late")
    assert job.spec.active_deadline_seconds == 10  # the first attempt gets all of it
    run_job(admin, namespace, "late", 2)
    wait_phase(admin, namespace, "late", "Running")
    st = wait_phase(admin, namespace, "late", "Failed", timeout=60)["status"]
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "DeadlineExceeded", st
    assert (st["restarts"], st["attempt"]) == (0, 0), st
    wait_for("the Job deleted, and no other made", lambda: not jobs(admin, namespace))
