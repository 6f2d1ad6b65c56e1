"""What every handler of one operator instance shares (Context): the settings, kopf's indices, the work
queue, the scraper, and what this operator wrote that the watches may not show yet; and the Snapshot of
one training and its children that a round plans from."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from kubernetes import client

from pets_operator import api, backends, ended_runs, metrics, observe, workqueue
from pets_operator.cluster import unless
from pets_operator.observe import Key
from pets_operator.plan_types import EndedRun
from pets_operator.scraper import Scraper, ScrapeTarget
from pets_operator.settings import Settings
from pets_operator.standby import Standby
from pets_operator.timestamps import parse_timestamp

SECOND = timedelta(seconds=1)
GONE_KEPT = timedelta(hours=1)  # how long a child the API server said was gone is remembered
CHANGE_WINDOW = 1.0  # seconds a change waits for the ones that follow it (see Context.trigger)
# kopf's in-memory indices, by id: the trainings, and the Jobs, pods and Services labelled as ours
TRAININGS_INDEX, JOBS_INDEX, PODS_INDEX, SERVICES_INDEX = (
    "pets_trainings", "pets_training_jobs", "pets_training_pods", "pets_training_services")



@dataclass(frozen=True)
class Snapshot:
    """One PetsTraining and its watched children, as the indices (and our own latest writes) hold them."""

    body: dict[str, Any]
    jobs: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    services: list[dict[str, Any]]
    ended: tuple[EndedRun, ...] = ()  # rank 0's runs that ended as their pods went (Context.keep_ended)


@dataclass
class Context:
    """What every handler of one operator instance shares."""

    api_client: client.ApiClient
    settings: Settings = field(default_factory=Settings)
    phases: metrics.PhaseBook = field(default_factory=metrics.PhaseBook)
    queue: workqueue.WorkQueue | None = None  # made in the operator's event loop, with the tasks
    indices: Mapping[str, Any] = field(default_factory=dict)  # kopf's, by index id
    scraper: Scraper | None = None
    # What this operator wrote and the indices may not show yet (the watch event is on its way): the
    # training's body after our status patch, and children we created, newest resourceVersion wins.
    written: dict[Key, dict[str, Any]] = field(default_factory=dict)
    created: dict[Key, dict[tuple[str, str], dict[str, Any]]] = field(default_factory=dict)
    seen: dict[Key, tuple[Any, ...]] = field(default_factory=dict)  # what of a training wakes it
    failures: dict[Key, int] = field(default_factory=dict)  # consecutive transient errors, for backoff
    status_written: dict[Key, float] = field(default_factory=dict)  # monotonic time of the last status write
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    standby: Standby | None = None  # whether kopf's peering lets this replica act (None: always)
    # Children the API server said it does not have (a delete answered 404) that an index still shows,
    # with when: kopf's indices drop an object only on its DELETED event, and a replica that was standby
    # (its watches paused by peering) while the object went never sees one; its re-listing on taking over
    # adds and updates, but removes nothing (make chaos found a gang restart waiting on such a Job).
    gone: dict[tuple[str, str, str], datetime] = field(default_factory=dict)
    # The trainings read from the API server since this replica last took over (None: it never stood
    # by, so its indices were listed fresh). While it stood by, another replica wrote their statuses,
    # and kopf's re-listing may come after its first rounds: a round over a stale status writes it back.
    reread: set[Key] | None = None
    # Rank 0's runs that ended as their pods went, by (attempt, start), until the stored status holds
    # them: the index drops a deleted pod, often before the round that would book its summary.
    ended: dict[Key, dict[tuple[int, str], EndedRun]] = field(default_factory=dict)

    def stood_by(self) -> None:
        """Peering paused this replica: when it acts again, each training is read afresh once."""
        self.reread = set()

    def needs_reread(self, key: Key) -> bool:
        return self.reread is not None and key not in self.reread

    def read_training(self, key: Key) -> dict[str, Any] | None:
        """The training as the API server has it now (None: gone). Blocking: run it in a thread."""
        with unless(404):  # gone: the index's deletion event will say so
            return cast(dict[str, Any], client.CustomObjectsApi(self.api_client).get_namespaced_custom_object(
                api.GROUP, api.VERSION, key[0], api.PLURAL, key[1]))
        return None

    def reread_as(self, key: Key, body: dict[str, Any] | None) -> None:
        """After a takeover, the training as just read, kept as our own newest write would be: `snapshot`
        plans from it where it is newer than the index's copy. In the event loop, like `snapshot`."""
        if body is not None and (key not in self.written or observe.rv(body) > observe.rv(self.written[key])):
            self.written[key] = observe.kept(body)
        if self.reread is not None:
            self.reread.add(key)

    def trigger(self, key: Hashable, priority: int = workqueue.CHANGED) -> None:
        """Wake a training: a new one at once; a change after CHANGE_WINDOW, so the burst of pod
        updates a start or an end makes (scheduled, started, ready, for every rank) is one round and
        one status write, not one each."""
        if self.queue is None:
            return
        if priority == workqueue.URGENT:
            self.queue.add(key, priority)
        else:
            self.queue.add_after(key, CHANGE_WINDOW, priority)

    def gone_now(self, kind: str, namespace: str, name: str) -> None:
        """The API server has no such child now: the indices' copy, and any made before now, is stale."""
        now = datetime.now(UTC)
        for old in [k for k, when in self.gone.items() if now - when > GONE_KEPT]:
            del self.gone[old]
        self.gone[(kind, namespace, name)] = now

    def keep_ended(self, key: Key, run: EndedRun | None) -> None:
        """A run of rank 0 that ended as its pod goes (ended_runs.of_pod): kept for the next rounds,
        the newest ended_runs.KEPT a training."""
        if run is None:
            return
        kept = self.ended.setdefault(key, {})
        kept[(run.attempt, run.started)] = run
        while len(kept) > ended_runs.KEPT:
            del kept[next(iter(kept))]

    def _stale(self, kind: str, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        when = self.gone.get((kind, str(meta.get("namespace")), str(meta.get("name"))))
        created = meta.get("creationTimestamp")
        # creationTimestamp has whole seconds: one made in the second of the 404 is a new one.
        return when is not None and (not created or parse_timestamp(str(created)) < when - SECOND)

    def forget(self, key: Key) -> None:
        """The training is gone: drop what is kept for it."""
        for kept in (self.written, self.created, self.seen, self.failures, self.status_written, self.ended):
            kept.pop(key, None)
        if self.queue is not None:
            self.queue.forget(key)
        if self.scraper is not None:
            self.scraper.forget(key)
        self.phases.set(key[0], key[1], None)

    def snapshot(self, key: Key) -> Snapshot | None:
        """The training and its children from the indices, merged with our own newer writes. Runs in the
        event loop, where kopf updates the indices, so it never sees one half-updated."""
        written = [self.written[key]] if key in self.written else []
        body = observe.newest([*self._indexed(TRAININGS_INDEX, key), *written])
        if body is None:
            return None
        if self.written.get(key) is not None and body is not self.written[key]:
            del self.written[key]  # the watch caught up
        children: dict[str, list[dict[str, Any]]] = {}
        created = self.created.get(key, {})
        for kind, index in (("Job", JOBS_INDEX), ("Pod", PODS_INDEX), ("Service", SERVICES_INDEX)):
            by_name = {o["metadata"]["name"]: o for o in self._indexed(index, key)
                       if not self._stale(kind, o)}
            for (ckind, name), obj in list(created.items()):
                if ckind != kind:
                    continue
                if name in by_name and observe.rv(by_name[name]) >= observe.rv(obj):
                    del created[(ckind, name)]  # the watch caught up
                else:
                    by_name[name] = obj
            children[kind] = list(by_name.values())
        ended = self.ended.get(key) or {}
        for run in ended_runs.settled(body.get("status") or {}, list(ended.values())):
            del ended[(run.attempt, run.started)]  # the stored status holds it
        if not ended:
            self.ended.pop(key, None)
        return Snapshot(body, children["Job"], children["Pod"], children["Service"], tuple(ended.values()))

    def _indexed(self, index_id: str, key: Key) -> list[dict[str, Any]]:
        return list((self.indices.get(index_id) or {}).get(key) or [])

    def scrape_targets(self) -> Iterable[ScrapeTarget]:
        """Rank 0 of every Running training, from the indices."""
        for key, phase in self.phases.items():
            if phase != api.RUNNING:
                continue
            body = observe.newest(self._indexed(TRAININGS_INDEX, key))
            if body is None:
                continue
            backend = backends.BACKENDS.get(str((body.get("status") or {}).get("backend")), backends.JOB)
            pod = observe.newest_rank0(backend, self._indexed(PODS_INDEX, key))
            st = (pod or {}).get("status") or {}
            if pod is not None and st.get("phase") == "Running" and st.get("podIP"):
                yield ScrapeTarget(key, str(pod["metadata"].get("uid") or ""), str(st["podIP"]))

