"""Whether this replica may act now. kopf's peering pauses a replica by stopping its watches when a live
peer has a higher priority (or the same one: then every replica pauses). The work queue's workers are
ours, not kopf's, and would go on acting on frozen indices (deadlines, progress polls): two replicas
would reconcile one training at once. Each round asks `Standby.acting` first, which reads the peering
objects as kopf does and applies kopf's own rule."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from pets_operator.timestamps import parse_timestamp

GROUP, VERSION = "kopf.dev", "v1"
RECHECK_SECONDS = 2.0  # a round acts on an answer at most this old
DEFAULT_LIFETIME = 60  # kopf's peering lifetime (seconds), when a record does not carry its own


def identity() -> str:
    """This replica's name in the peering objects: its pod (POD_ID, set by the chart), else one of its
    own (kopf would make up one we could not know)."""
    return os.environ.get("POD_ID") or f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"


def pausing_peers(peers: Mapping[str, Mapping[str, Any]], own: str, priority: int,
                  now: datetime) -> list[str]:
    """The live peers other than `own` that pause it, by kopf's rule (1.45): a priority above ours, or
    equal to it (a tie pauses all). A peer is live until its lastseen plus its lifetime."""
    found = []
    for name, peer in peers.items():
        if name == own or not isinstance(peer, Mapping) or not peer.get("lastseen"):
            continue
        lifetime = timedelta(seconds=float(peer.get("lifetime") or DEFAULT_LIFETIME))
        if parse_timestamp(str(peer["lastseen"])) + lifetime <= now:
            continue
        if int(peer.get("priority") or 0) >= priority:
            found.append(name)
    return sorted(found)


class Standby:
    """Reads the peering object(s) at most every RECHECK_SECONDS; `acting()` is False while a peer
    pauses this replica. No peering (standalone): always acting."""

    def __init__(self, api_client: client.ApiClient | None, peering_name: str | None,
                 namespaces: Sequence[str], own: str, priority: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api = client.CustomObjectsApi(api_client) if api_client is not None else None
        self.peering_name, self.namespaces = peering_name, tuple(namespaces)
        self.own, self.priority, self.clock = own, priority, clock
        self.checked_at = float("-inf")
        self.paused_by: list[str] = []

    def due(self) -> bool:
        """Whether `acting` would read the peering objects (the event loop runs it in a thread then)."""
        return self.peering_name is not None and self.clock() - self.checked_at >= RECHECK_SECONDS

    def acting(self) -> bool:
        if self.peering_name is None or self.api is None:
            return True
        if self.due():
            # the API server is away: nothing can be done this round anyway; keep the answer
            with contextlib.suppress(ApiException):
                now = datetime.now(UTC)
                self.paused_by = sorted({peer for peers in self._peerings()
                                         for peer in pausing_peers(peers, self.own, self.priority, now)})
            self.checked_at = self.clock()
        return not self.paused_by

    def _peerings(self) -> list[Mapping[str, Any]]:
        """The status (peer -> record) of each peering object this replica takes part in."""
        api, name = self.api, self.peering_name
        assert api is not None and name is not None
        if not self.namespaces:
            objs = [api.get_cluster_custom_object(GROUP, VERSION, "clusterkopfpeerings", name)]
        else:
            objs = [api.get_namespaced_custom_object(GROUP, VERSION, ns, "kopfpeerings", name)
                    for ns in self.namespaces]
        return [cast(dict[str, Any], obj).get("status") or {} for obj in objs]
