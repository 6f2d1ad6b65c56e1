"""Against a real API server with the operator running: an edit made while suspended takes effect on
resume, and a queued training's workload suspend is left to the queue (here played by the test, as the
job controller is; the real Kueue runs in e2e)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pets_operator import api
from polling import wait_for
from test_operator_lifecycle import (
    create_training,
    get_training,
    jobs,
    patch_spec,
    reconciles,
    run_job,
    the_job,
    wait_phase,
)

pytestmark = pytest.mark.integration


def _args(job: client.V1Job) -> list[str]:
    return list(job.spec.template.spec.containers[0].args)


def _flag(job: client.V1Job, flag: str) -> str:
    args = _args(job)
    return args[args.index(flag) + 1]


def test_an_edit_while_suspended_takes_effect_on_resume(admin: client.ApiClient, operator: Any,
                                                         namespace: str) -> None:
    create_training(admin, namespace, "edited", replicas=2, epochs=3, suspend=True)
    first = the_job(admin, namespace, "edited")
    assert first.spec.suspend is True and first.spec.parallelism == 2
    wait_phase(admin, namespace, "edited", api.SUSPENDED)

    # Suspended: the workload does not run, so the API takes the edit ...
    patch_spec(admin, namespace, "edited", {"replicas": 3, "epochs": 9})
    rebuilt = the_job(admin, namespace, "edited-r1")
    assert rebuilt.spec.suspend is True and rebuilt.spec.parallelism == 3 and rebuilt.spec.completions == 3
    assert _flag(rebuilt, "--epochs") == "9"
    assert _flag(rebuilt, "--checkpoint-dir") != _flag(first, "--checkpoint-dir")  # a new shape starts afresh
    wait_for("the Job built from the old spec to go",
             lambda: [j.metadata.name for j in jobs(admin, namespace)] == ["edited-r1"])
    # ... and resuming runs what the spec says, with status claiming that generation and no restart.
    patch_spec(admin, namespace, "edited", {"suspend": False})
    wait_for("the rebuilt Job to be resumed",
             lambda: the_job(admin, namespace, "edited-r1").spec.suspend is False)
    pt = get_training(admin, namespace, "edited")
    assert pt is not None
    st = pt["status"]
    assert st["observedGeneration"] == pt["metadata"]["generation"]
    assert (st["attempt"], st["restarts"], st["totalEpochs"]) == (1, 0, 9)
    assert st["children"]["job"] == "edited-r1"
    # Now the workload runs: the fields that shape it are refused, naming the field, until it is suspended.
    wait_for("status.workloadActive", lambda: (get_training(admin, namespace, "edited") or {}).get(
        "status", {}).get("workloadActive") is True)
    with pytest.raises(ApiException) as err:
        patch_spec(admin, namespace, "edited", {"epochs": 4})
    assert err.value.status == 422
    assert "spec.epochs is immutable while the training's workload runs" in err.value.body


def _workload_active(admin: client.ApiClient, ns: str, name: str) -> bool:
    return bool(((get_training(admin, ns, name) or {}).get("status") or {}).get("workloadActive"))


def test_an_edit_is_taken_as_soon_as_suspend_is_asked(admin: client.ApiClient, operator: Any,
                                                       namespace: str) -> None:
    """No message tells a user to suspend a training they have just suspended: once spec.suspend is true
    (before the edit, or in the same write) the edit is taken, though the workload is still going."""
    create_training(admin, namespace, "draining", replicas=2, epochs=3)
    the_job(admin, namespace, "draining")
    run_job(admin, namespace, "draining", 2)
    wait_for("status.workloadActive", lambda: _workload_active(admin, namespace, "draining"))
    operator.stop()  # holds open the moments between the suspend and the workload's going
    try:
        with pytest.raises(ApiException) as err:
            patch_spec(admin, namespace, "draining", {"epochs": 4})
        assert err.value.status == 422 and "set spec.suspend: true with the edit" in err.value.body
        patch_spec(admin, namespace, "draining", {"suspend": True})
        assert _workload_active(admin, namespace, "draining")  # the window the edit used to be refused in
        patch_spec(admin, namespace, "draining", {"replicas": 3})
    finally:
        operator.start()
    rebuilt = the_job(admin, namespace, "draining-r1")
    assert rebuilt.spec.suspend is True and rebuilt.spec.parallelism == 3
    wait_for("the Job built from the old spec to go",
             lambda: [j.metadata.name for j in jobs(admin, namespace)] == ["draining-r1"])
    wait_phase(admin, namespace, "draining", api.SUSPENDED)

    # Running again: suspend and edit in one write are taken too.
    patch_spec(admin, namespace, "draining", {"suspend": False})
    wait_for("the rebuilt Job to be resumed",
             lambda: the_job(admin, namespace, "draining-r1").spec.suspend is False)
    run_job(admin, namespace, "draining-r1", 3)
    wait_for("status.workloadActive", lambda: _workload_active(admin, namespace, "draining"))
    patch_spec(admin, namespace, "draining", {"suspend": True, "epochs": 4})
    again = the_job(admin, namespace, "draining-r2")
    assert again.spec.suspend is True and _flag(again, "--epochs") == "4"


def _set_job_suspend(admin: client.ApiClient, ns: str, name: str, value: bool) -> None:
    client.BatchV1Api(admin).patch_namespaced_job(name, ns, {"spec": {"suspend": value}},
                                                  field_manager="kueue-stand-in")


def _suspend_writers(job: client.V1Job) -> set[str]:
    """Field managers that own the Job's spec.suspend."""
    return {m.manager for m in job.metadata.managed_fields or []
            if "f:suspend" in ((m.fields_v1 or {}).get("f:spec") or {})}


def test_the_operator_never_writes_suspend_on_a_queued_workload(admin: client.ApiClient, operator: Any,
                                                               namespace: str) -> None:
    body = {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": "queued", "labels": {api.KUEUE_QUEUE_LABEL: "team-a",
                                                      api.KUEUE_PRIORITY_LABEL: "high"}},
            "spec": {"backend": "job", "replicas": 2}}
    client.CustomObjectsApi(admin).create_namespaced_custom_object(api.GROUP, api.VERSION, namespace,
                                                                   api.PLURAL, body)
    job = the_job(admin, namespace, "queued")
    # Created suspended, carrying the queue's labels, for Kueue to admit.
    assert job.spec.suspend is True
    assert job.metadata.labels[api.KUEUE_QUEUE_LABEL] == "team-a"
    assert job.metadata.labels[api.KUEUE_PRIORITY_LABEL] == "high"
    wait_phase(admin, namespace, "queued", api.QUEUED)
    # This control plane has no Kueue: the next round says so (a message within the phase: it may come
    # up to pacing.STATUS_WRITE_INTERVAL after the "created" one).
    wait_for("the message that Kueue is not installed", lambda: "Kueue is not installed" in (
        (get_training(admin, namespace, "queued") or {}).get("status") or {}).get("message", ""), 30)

    # The queue admits it: the operator follows and does not suspend it back ...
    _set_job_suspend(admin, namespace, "queued", False)
    run_job(admin, namespace, "queued", 2)
    before = reconciles()
    wait_for("the operator to reconcile the admitted Job", lambda: reconciles() >= before + 2)
    admitted = the_job(admin, namespace, "queued")
    assert admitted.spec.suspend is False
    # ... and when the queue takes it back, the operator leaves that alone too.
    _set_job_suspend(admin, namespace, "queued", True)
    before = reconciles()
    wait_for("the operator to reconcile the re-suspended Job", lambda: reconciles() >= before + 2)
    again = the_job(admin, namespace, "queued")
    assert again.spec.suspend is True
    # The last writer of spec.suspend owns it: had the operator flipped it, it would own it now.
    assert _suspend_writers(again) == {"kueue-stand-in"}
    assert len(jobs(admin, namespace)) == 1
