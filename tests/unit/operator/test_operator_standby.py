"""A replica that kopf's peering paused does not act (standby.py): kopf stops its watches, and the work
queue's workers, which are ours, ask the peering object before each round."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from pets_operator import standby
from pets_operator.timestamps import timestamp

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 27, 18, 0, tzinfo=UTC)


def peer(priority: int, seen_ago: float = 5, lifetime: int = 60) -> dict[str, Any]:
    return {"priority": priority, "lastseen": timestamp(NOW - timedelta(seconds=seen_ago)),
            "lifetime": lifetime}


def test_kopfs_rule_a_live_peer_of_higher_or_equal_priority_pauses_and_a_dead_or_lower_one_does_not() -> None:
    assert standby.pausing_peers({"me": peer(5), "b": peer(9)}, "me", 5, NOW) == ["b"]
    assert standby.pausing_peers({"me": peer(5), "b": peer(5)}, "me", 5, NOW) == ["b"]  # a tie: all pause
    assert standby.pausing_peers({"me": peer(5), "b": peer(3)}, "me", 5, NOW) == []
    # SIGKILLed without leaving: it pauses until its record expires
    assert standby.pausing_peers({"me": peer(5), "b": peer(9, seen_ago=59)}, "me", 5, NOW) == ["b"]
    assert standby.pausing_peers({"me": peer(5), "b": peer(9, seen_ago=61)}, "me", 5, NOW) == []
    assert standby.pausing_peers({"me": peer(5), "odd": "not a record"}, "me", 5, NOW) == []  # type: ignore[dict-item]


class Peerings:
    """CustomObjectsApi's two reads, over the peering objects given (their status: peer -> record)."""

    def __init__(self, statuses: dict[str, dict[str, Any]]) -> None:
        self.statuses, self.reads = statuses, 0
        self.down = False

    def _read(self, where: str) -> dict[str, Any]:
        self.reads += 1
        if self.down:
            raise ApiException(status=503)
        return {"status": self.statuses[where]}

    def get_cluster_custom_object(self, group: str, version: str, plural: str, name: str) -> dict[str, Any]:
        assert (group, version, plural, name) == ("kopf.dev", "v1", "clusterkopfpeerings", "pets-training")
        return self._read("cluster")

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str,
                                     name: str) -> dict[str, Any]:
        assert plural == "kopfpeerings"
        return self._read(namespace)


def guard(api: Peerings, namespaces: tuple[str, ...] = (), clock: list[float] | None = None
          ) -> standby.Standby:
    ticks = clock if clock is not None else [0.0]
    g = standby.Standby(None, "pets-training", namespaces, "me", 5, clock=lambda: ticks[0])
    g.api = api  # type: ignore[assignment]
    return g


def fresh(priority: int) -> dict[str, Any]:
    return {"priority": priority, "lastseen": timestamp(datetime.now(UTC)), "lifetime": 60}


def test_a_paused_replica_stops_acting_and_acts_again_once_the_peer_is_gone_read_at_most_every_2_s() -> None:
    api = Peerings({"cluster": {"me": fresh(5), "other": fresh(9)}})
    clock = [0.0]
    g = guard(api, clock=clock)
    assert g.acting() is False and g.paused_by == ["other"]
    del api.statuses["cluster"]["other"]  # it left the peering (a graceful stop)
    clock[0] = 1.0
    assert g.acting() is False and api.reads == 1  # the answer of 1 s ago
    clock[0] = 2.5
    assert g.acting() is True and api.reads == 2
    api.down, clock[0] = True, 5.0
    assert g.acting() is True  # the API server away: the last answer stands


def test_namespaced_mode_reads_each_namespaces_peering_and_standalone_always_acts() -> None:
    api = Peerings({"a": {"me": fresh(5)}, "b": {"me": fresh(5), "other": fresh(7)}})
    assert guard(api, ("a", "b")).acting() is False and api.reads == 2
    assert standby.Standby(None, None, (), "me", 5).acting() is True


def test_identity_is_the_pod_when_the_chart_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_ID", "pets-abc-123")
    assert standby.identity() == "pets-abc-123"
    monkeypatch.delenv("POD_ID")
    assert standby.identity() != standby.identity()  # made up, and unique to each process
