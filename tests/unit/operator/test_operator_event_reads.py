"""What a round reads of the namespace's Events costs the same among 1 training as among 1,000 (issue 58):
each waiting pod's Warning Events are asked for by its own name, so the API server sends only those."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pets_operator import cluster

pytestmark = pytest.mark.unit


def warning(pod: str, reason: str, message: str) -> SimpleNamespace:
    return SimpleNamespace(involved_object=SimpleNamespace(kind="Pod", name=pod), type="Warning",
                           reason=reason, message=message)


class FakeEvents:
    """list_namespaced_event as the API server answers it: the field selector applied server-side; each call
    and the Events it sent counted."""

    def __init__(self, events: list[SimpleNamespace]):
        self.events = events
        self.calls: list[str] = []
        self.sent = 0

    def list_namespaced_event(self, namespace: str, resource_version: str | None = None,
                              field_selector: str = "") -> SimpleNamespace:
        self.calls.append(field_selector)
        wanted = dict(term.split("=", 1) for term in field_selector.split(",") if term)
        fields = {"involvedObject.kind": lambda e: e.involved_object.kind,
                  "involvedObject.name": lambda e: e.involved_object.name, "type": lambda e: e.type}
        items = [e for e in self.events if all(fields[k](e) == v for k, v in wanted.items())]
        self.sent += len(items)
        return SimpleNamespace(items=items)


def events_of(trainings: int) -> list[SimpleNamespace]:
    """Our training's waiting pod's mount failure, and two Warning Events of every other training's pods."""
    others = [warning(f"other-{i}-{rank}-x", "FailedScheduling", "0/50 nodes are available")
              for i in range(trainings - 1) for rank in range(2)]
    return [*others, warning("pets-0-x", "FailedMount", 'MountVolume.SetUp failed for volume "output"')]


def fake_cluster(core: FakeEvents) -> cluster.Cluster:
    cl = cluster.Cluster.__new__(cluster.Cluster)
    cl.namespace, cl.name = "ns", "pets"
    cl.core = core  # type: ignore[assignment]
    return cl


@pytest.mark.parametrize("trainings", [1, 1000])
def test_a_waiting_pods_warnings_cost_one_call_that_sends_only_its_own(trainings: int) -> None:
    core = FakeEvents(events_of(trainings))
    found = fake_cluster(core).pod_warnings(["pets-0-x", "pets-1-x"])
    assert found == {"pets-0-x": [{"reason": "FailedMount",
                                   "message": 'MountVolume.SetUp failed for volume "output"'}]}
    assert core.calls == ["involvedObject.kind=Pod,involvedObject.name=pets-0-x,type=Warning",
                          "involvedObject.kind=Pod,involvedObject.name=pets-1-x,type=Warning"]
    assert core.sent == 1  # the namespace's other Events stay on the server


def test_no_waiting_pod_reads_no_event() -> None:
    core = FakeEvents(events_of(1000))
    assert fake_cluster(core).pod_warnings([]) == {} and core.calls == []

