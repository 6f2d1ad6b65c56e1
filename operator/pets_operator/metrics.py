"""The operator's own Prometheus metrics (served by `pets-operator run --metrics-port`)."""

from __future__ import annotations

from collections import Counter as _Tally

from prometheus_client import Counter, Gauge, Histogram

from pets_operator import api

RECONCILES = Counter(
    "pets_operator_reconciles_total", "Reconciliations of PetsTrainings, by result", ["result"]
)
ERRORS = Counter("pets_operator_errors_total", "Errors while reconciling, by kind", ["kind"])
RECONCILE_SECONDS = Histogram(
    "pets_operator_reconcile_seconds", "Time spent in one reconciliation",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
TRAININGS = Gauge("pets_operator_trainings", "PetsTrainings known to this operator, by phase", ["phase"])
CHILDREN_CREATED = Counter(
    "pets_operator_children_created_total", "Objects created for PetsTrainings, by kind", ["kind"]
)
RESTARTS = Counter("pets_operator_gang_restarts_total", "Gang restarts after a failed attempt")
QUEUE_DEPTH = Gauge("pets_operator_queue_depth", "PetsTrainings waiting for a reconciliation worker")
SCRAPES = Counter("pets_operator_progress_scrapes_total", "Reads of rank 0's progress endpoint, by result",
                  ["result"])
SCRAPE_PASS_SECONDS = Histogram(
    "pets_operator_progress_scrape_pass_seconds", "Time one pass over every running training's rank 0 takes",
    buckets=(0.1, 0.5, 1, 2, 5, 10, 20, 30, 60),
)

# The label values known in advance, served as 0 from the start: a rate over them is then 0, not "no
# series", and the dashboard's panels show a healthy operator's zero errors rather than "No data".
for _result in ("ok", "error"):
    RECONCILES.labels(result=_result)
    SCRAPES.labels(result=_result)
for _kind in ("permanent", "temporary"):
    ERRORS.labels(kind=_kind)


class PhaseBook:
    """The phase of every training this operator watches; feeds the `pets_operator_trainings` gauge."""

    def __init__(self) -> None:
        self._phases: dict[tuple[str, str], str] = {}

    def items(self) -> list[tuple[tuple[str, str], str]]:
        return list(self._phases.items())

    def set(self, namespace: str, name: str, phase: str | None) -> None:
        if self._phases.get((namespace, name)) == phase:
            return
        if phase is None:
            self._phases.pop((namespace, name), None)
        else:
            self._phases[(namespace, name)] = phase
        tally = _Tally(self._phases.values())
        for p in api.PHASES:
            TRAININGS.labels(phase=p).set(tally.get(p, 0))
