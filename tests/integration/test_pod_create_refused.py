"""Pods the API server refuses to create (issue 21), against a real API server with the chart's RBAC:
the Job controller is off here, so the test writes the Job's FailedCreate Event as that controller does
(a quota refusal, in its words), and the real operator must read it (a `list events` with a field
selector on the Job) and say PodCreateRefused in status. The e2e suite makes real refusals."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from conftest import OperatorThread, wait_for
from kubernetes import client
from test_placement_and_node_loss import create_training, the_job, training_status

pytestmark = pytest.mark.integration

QUOTA = ('Error creating: pods "refused-0-x7k2p" is forbidden: exceeded quota: tiny, requested: '
         "requests.cpu=800m, used: requests.cpu=0, limited: requests.cpu=200m")


def test_a_jobs_failed_create_event_reaches_status_as_pod_create_refused(
        admin: client.ApiClient, operator: OperatorThread, namespace: str) -> None:
    create_training(admin, namespace, "refused", replicas=2)
    job = the_job(admin, namespace, "refused")
    now = datetime.now(UTC)
    client.CoreV1Api(admin).create_namespaced_event(namespace, client.CoreV1Event(
        metadata=client.V1ObjectMeta(name="refused.failedcreate"),
        involved_object=client.V1ObjectReference(api_version="batch/v1", kind="Job", name="refused",
                                                 namespace=namespace, uid=job.metadata.uid),
        reason="FailedCreate", message=QUOTA, type="Warning", count=3, first_timestamp=now,
        last_timestamp=now, source=client.V1EventSource(component="job-controller")))

    def refused() -> dict[str, Any] | None:
        st = training_status(admin, namespace, "refused")
        progressing = next((c for c in st.get("conditions") or [] if c["type"] == "Progressing"), {})
        return st if progressing.get("reason") == "PodCreateRefused" else None

    st = wait_for("status Progressing=PodCreateRefused", refused)
    assert st["phase"] == "Pending"
    assert st["message"].startswith("2/2 pod(s) waiting: 3 pod create(s) refused: a ResourceQuota"), st
    assert "exceeded quota: tiny" in st["message"] and "quota's usage drops" in st["message"], st
    # kopf posts Events from a queue of its own, after the status write: wait for it, then count.
    def events() -> list[Any]:
        return list(client.CoreV1Api(admin).list_namespaced_event(
            namespace, field_selector="involvedObject.name=refused,reason=PodCreateRefused").items)

    wait_for("the PodCreateRefused Event", events)
    assert len(events()) == 1, [e.message for e in events()]
