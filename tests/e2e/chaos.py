"""The chaos run's logic, kept apart from the cluster (tests/e2e/test_chaos.py drives it; tests/unit checks
it): the seeded schedule of faults, what each injected fault should cost each training, and the reading
of what was observed into the run's figures and its broken promises."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# The kinds of fault, in the order the figures list them.
OPERATOR = "operator"  # the acting replica's pod deleted with no grace (SIGKILL); the other takes over
APISERVER = "kube-apiserver"  # SIGKILL, restarted with the same flags
ETCD = "etcd"  # SIGKILL, restarted on its data
POD = "pod"  # a trainer pod deleted (SIGTERM: the step checkpoint, then exit 75)
NODE = "node"  # a worker node lost (no word to the API server), restored later
EDIT = "edit"  # spec.maxRestarts of a running training changed
KINDS = (OPERATOR, APISERVER, ETCD, POD, NODE, EDIT)
MIN_APART_S = 15.0  # between two of the faults that happen once
# The faults that end a training's attempt: each costs it one gang restart, counted as a disruption.
DISRUPTING = (POD, NODE)


@dataclass(frozen=True)
class Mode:
    trainings: int
    queued: int  # how many of them go through Kueue
    epochs: int
    duration_s: float  # the window faults are drawn in (they stop early when every training is done)
    operator_every_s: tuple[float, float] = (20.0, 40.0)
    node_down_s: float = 75.0  # a lost node comes back after this


MODES = {
    # CI's: every kind of fault once, on a few trainings. Each must outlast the faults' window (they end
    # by 0.8 of it): with 8 epochs they ended by 91 s and the node fault found nothing to hit.
    "short": Mode(trainings=3, queued=1, epochs=24, duration_s=180.0),
    # make chaos: the batch, 8 trainings, some under Kueue; 16 epochs, scaled as short's were
    # (not yet run at 16).
    "full": Mode(trainings=8, queued=3, epochs=16, duration_s=420.0),
}


@dataclass(frozen=True, order=True)
class Fault:
    at: float  # seconds after the batch was created
    kind: str
    node_down_s: float = 0.0  # NODE: how long it stays lost


def schedule(seed: int, mode: Mode) -> list[Fault]:
    """The faults of one run, a function of the seed: the operator killed every 20-40 s through the
    whole window; the API server, etcd, a trainer pod, a node and two edits once each, in a shuffled
    order over the window's middle (from a fifth to four fifths: the batch has started and has not
    ended), one to a slot with some jitter, at least MIN_APART_S from each other so that each one's cost
    is its own."""
    rng = random.Random(seed)
    faults = []
    at = rng.uniform(*mode.operator_every_s)
    while at < mode.duration_s:
        faults.append(Fault(at, OPERATOR))
        at += rng.uniform(*mode.operator_every_s)
    once = [APISERVER, ETCD, POD, NODE, EDIT, EDIT]
    rng.shuffle(once)
    begin, width = 0.2 * mode.duration_s, 0.6 * mode.duration_s / len(once)
    jitter = max(0.0, width - MIN_APART_S)
    for slot, kind in enumerate(once):
        at = begin + slot * width + rng.uniform(0.0, jitter)
        faults.append(Fault(at, kind, mode.node_down_s if kind == NODE else 0.0))
    return sorted(faults)


@dataclass
class Injected:
    """One fault as it happened: when, to what, and which trainings it should cost a gang restart."""
    at: float
    kind: str
    target: str
    hits: tuple[str, ...] = ()  # trainings whose running attempt it ended
    detail: str = ""


def expected_disruptions(log: Iterable[Injected]) -> Counter[str]:
    """Per training, the gang restarts the faults owe it: one for each pod or node fault that ended its
    attempt. The control plane's and the operator's faults owe none."""
    owed: Counter[str] = Counter()
    for fault in log:
        if fault.kind in DISRUPTING:
            owed.update(fault.hits)
    return owed


@dataclass
class Sample:
    """A training's status as read at one moment: where its progress was."""
    at: float
    attempt: int
    step: int


def progress_regressions(samples: Mapping[str, list[Sample]]) -> list[str]:
    """Each time a training's status.step went down but across a resume. The status names the next
    attempt before that attempt reports (its step is still the last one read of the one before), so
    within an attempt the step may go down once, to where it resumed, before it first goes up."""
    found = []
    for name, seen in samples.items():
        resumed = {seen[0].attempt} if seen else set()
        for before, after in zip(seen, seen[1:], strict=False):
            if after.attempt < before.attempt:
                found.append(f"{name}: attempt {before.attempt} -> {after.attempt} (at {after.at:.0f} s)")
            elif after.step > before.step:
                resumed.add(after.attempt)  # this attempt's own progress: no going back from here
            elif after.step < before.step:
                if after.attempt in resumed:
                    found.append(f"{name}: step {before.step} -> {after.step} within attempt {after.attempt} "
                                 f"(at {before.at:.0f} s and {after.at:.0f} s)")
                resumed.add(after.attempt)
    return found


def jobs_per_attempt(jobs: Iterable[tuple[str, str, str]]) -> dict[tuple[str, str], set[str]]:
    """(training, attempt) -> the uids of the Jobs seen for it, from (training, attempt, uid) sightings."""
    seen: dict[tuple[str, str], set[str]] = defaultdict(set)
    for training, attempt, uid in jobs:
        seen[(training, attempt)].add(uid)
    return dict(seen)


@dataclass
class Outcome:
    """What the run ends with: the figures to print, and every promise it saw broken."""
    figures: dict[str, Any] = field(default_factory=dict)
    broken: list[str] = field(default_factory=list)


def judge(statuses: Mapping[str, Mapping[str, Any]], specs: Mapping[str, Mapping[str, Any]],
          log: list[Injected], edits: Mapping[str, int], jobs: Mapping[tuple[str, str], set[str]],
          samples: Mapping[str, list[Sample]]) -> Outcome:
    """The run's end, judged by the issue's rules: every training Succeeded; each attempt had exactly
    one Job; restarts and disruptions are what the faults owe; no edit was lost; progress never went
    backwards but across a resume."""
    out = Outcome()
    owed = expected_disruptions(log)
    for name, status in sorted(statuses.items()):
        if status.get("phase") != "Succeeded":
            out.broken.append(f"{name}: {status.get('phase')} ({status.get('message')})")
        restarts, disruptions = int(status.get("restarts") or 0), int(status.get("disruptions") or 0)
        if (restarts, disruptions) != (owed[name], owed[name]):
            out.broken.append(f"{name}: restarts {restarts}, disruptions {disruptions}; the faults that hit "
                              f"it owe {owed[name]} of each")
        for attempt in range(int(status.get("attempt") or 0) + 1):
            uids = jobs.get((name, str(attempt)), set())
            if len(uids) != 1:
                out.broken.append(f"{name}: attempt {attempt} had {len(uids)} Jobs ({sorted(uids)})")
    for name, value in sorted(edits.items()):
        kept = (specs.get(name) or {}).get("maxRestarts")
        if kept != value:
            out.broken.append(f"{name}: spec.maxRestarts was edited to {value} mid-run, and is {kept}")
    out.broken.extend(progress_regressions(samples))
    goodputs = [status.get("goodput") or {} for status in statuses.values()]
    out.figures = {
        "faults": {kind: sum(1 for f in log if f.kind == kind) for kind in KINDS},
        "trainings": len(statuses),
        "succeeded": sum(1 for s in statuses.values() if s.get("phase") == "Succeeded"),
        "extra_attempts": sum(int(s.get("attempt") or 0) for s in statuses.values()),
        "lost_seconds": round(sum(float(g.get("lostSeconds") or 0) for g in goodputs), 1),
        "lost_steps": sum(int(run.get("lostSteps") or 0) for g in goodputs
                          for run in g.get("attempts") or []),
        "broken": len(out.broken),
    }
    return out
