"""End to end: the chart's dashboard and alert rules against a real Prometheus server (the `prometheus`
add-on: `cluster.sh addon-up prometheus`, http://prometheus.pets-prometheus.svc:9090), which scrapes the
operator and the trainers' rank 0 as the chart's ServiceMonitor and PodMonitor tell it to.

While a training runs, every panel's PromQL, taken from the dashboard JSON the chart renders, returns
series through Prometheus's HTTP API; a query that returns none fails the test, naming its panel. The
trainer panels show this training. Prometheus scrapes the operator and exactly one pod of the training
(rank 0, of two), and the chart's alert rules, loaded as its rule files, are all evaluated healthy.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from polling import wait_for
from trainings import (
    LONGER_SPEC,
    OPERATOR_NAMESPACE,
    RELEASE,
    REPO,
    TRAIN_TIMEOUT_S,
    Trainings,
    addon,
    helm_binary,
    pod_of_rank,
)

pytestmark = pytest.mark.e2e

sys.path.insert(0, str(REPO / "tests" / "cluster"))
from prometheus_manifests import NAME, NAMESPACE, PORT  # noqa: E402
from s3_harness import port_forward  # noqa: E402

CHART = REPO / "charts" / "pets-training"
# Grafana's own variables, as it fills them for the add-on's 5 s scrapes ($__rate_interval is at least four
# scrape intervals). A variable not named here fails the test: the dashboard grew one this test must fill.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m"}
# Two ranks (Prometheus must keep rank 0 only), and epochs enough to still run a minute or more after
# the first one's eval accuracy, through the scrapes and the queries.
SPEC: dict[str, Any] = {**LONGER_SPEC, "epochs": 5}
TRAINING = "watched"
SCRAPE_WAIT_S = 180  # discovery, the first scrapes and a rate's second sample on a busy 2-core node


def rendered_chart() -> list[dict[str, Any]]:
    """The chart as the e2e's release renders it with its monitoring on (what the add-on translated)."""
    argv = [helm_binary(), "template", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE,
            "--values", str(CHART / "ci" / "monitoring-values.yaml")]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def panel_queries(chart: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel, rows' panels included, variables filled."""
    (configmap,) = [d for d in chart
                    if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    dashboard = json.loads(configmap["data"]["pets-training.json"])

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels") or [])

    found = []
    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets") or []:
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"panel {panel['title']!r}: a Grafana variable not filled here: {expr}"
            found.append((panel["title"], expr))
    assert found, "the rendered dashboard has no queries"
    return found


def rule_groups(chart: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (rule,) = [d for d in chart if d["kind"] == "PrometheusRule"]
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


@contextlib.contextmanager
def prometheus_api() -> Iterator[Any]:
    """GET of Prometheus's HTTP API (/api/v1/...) through a port-forward to its Service; returns `data`."""
    with port_forward(namespace=NAMESPACE, service=NAME, port=PORT) as base:
        def get(path: str, **params: str) -> Any:
            url = f"{base}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
            with urllib.request.urlopen(url, timeout=30) as response:
                body = json.load(response)
            assert body.get("status") == "success", body
            return body["data"]
        yield get


@pytest.fixture(scope="module")
def prometheus_server() -> Iterator[None]:
    """The add-on, its scrape jobs translated from the monitors of the release these tests install."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PETS_PROMETHEUS_RELEASE", RELEASE)
        env.setenv("PETS_PROMETHEUS_RELEASE_NAMESPACE", OPERATOR_NAMESPACE)
        addon("prometheus")
    yield


def scraped(get: Any, trainings: Trainings, operator_job: str) -> dict[str, Any] | None:
    """The active targets of the operator and of the training, once all are up; None until then."""
    targets = get("targets", state="active")["activeTargets"]
    operator = [t for t in targets if t["labels"].get("job") == operator_job]
    trainers = [t for t in targets if t["labels"].get("namespace") == trainings.namespace
                and t["labels"].get("training") == TRAINING]
    if not operator or not trainers or any(t["health"] != "up" for t in operator + trainers):
        return None
    return {"operator": operator, "trainers": trainers}


def empty_panels(get: Any, queries: list[tuple[str, str]], namespace: str) -> list[str]:
    """What is wrong with the panels now: each query that returns no series, or (on a trainer panel whose
    series carry the training's name) none of this training."""
    wrong = []
    for title, expr in queries:
        series = get("query", query=expr)["result"]
        named = {(s["metric"].get("namespace"), s["metric"]["training"]) for s in series
                 if "training" in s["metric"]}
        if not series:
            wrong.append(f"panel {title!r}: no series for {expr}")
        elif named and (namespace, TRAINING) not in named:
            wrong.append(f"panel {title!r}: no series of {namespace}/{TRAINING} (only {sorted(named)}) "
                         f"for {expr}")
    return wrong


@pytest.mark.usefixtures("prometheus_server")
def test_every_dashboard_panel_shows_a_running_training(trainings: Trainings) -> None:
    t0 = time.monotonic()
    chart = rendered_chart()
    queries = panel_queries(chart)
    groups = rule_groups(chart)
    (monitor,) = [d for d in chart if d["kind"] == "ServiceMonitor"]
    operator_job = monitor["metadata"]["name"]  # job = the Service's name, which the monitor shares

    trainings.create(TRAINING, SPEC)
    trainings.wait_epoch(TRAINING, 1)  # eval accuracy exists from the first epoch's end
    with prometheus_api() as get:
        targets = wait_for("Prometheus scraping the operator and the training's rank 0",
                           lambda: scraped(get, trainings, operator_job), SCRAPE_WAIT_S, 2.0)
        rank0 = pod_of_rank(trainings.pods(TRAINING), 0).metadata.name
        assert [t["labels"]["pod"] for t in targets["trainers"]] == [rank0], targets["trainers"]

        # Every panel at once, in a round that starts and ends with the training Running.
        wrong: list[str] = ["no round of queries while it ran"]
        rounds, deadline = 0, time.monotonic() + TRAIN_TIMEOUT_S
        while wrong and time.monotonic() < deadline:
            if trainings.status(TRAINING).get("phase") != "Running":
                break
            attempt = empty_panels(get, queries, trainings.namespace)
            if trainings.status(TRAINING).get("phase") != "Running":
                break
            wrong, rounds = attempt, rounds + 1
            if wrong:
                time.sleep(5)
        assert not wrong, (f"while {trainings.namespace}/{TRAINING} ran ({rounds} rounds of queries):\n"
                           + "\n".join(wrong) + "\n" + trainings.describe(TRAINING))

        # The chart's alert rules, loaded as rule files, all parsed and evaluated without error.
        def evaluated() -> list[dict[str, Any]] | None:
            loaded = get("rules")["groups"]
            rules = [r for g in loaded for r in g["rules"]]
            done = all(not r.get("lastEvaluation", "").startswith("0001-") for r in rules)
            return loaded if rules and done else None
        loaded = wait_for("every alert rule evaluated once", evaluated, 60, 2.0)
    assert sorted(g["name"] for g in loaded) == sorted(g["name"] for g in groups), loaded
    expected = sorted(r["alert"] for g in groups for r in g["rules"])
    assert sorted(r["name"] for g in loaded for r in g["rules"]) == expected, loaded
    unhealthy = [(r["name"], r.get("lastError")) for g in loaded for r in g["rules"] if r["health"] != "ok"]
    assert not unhealthy, unhealthy

    trainings.wait_phase(TRAINING, "Succeeded")
    print(f"[dashboard] {len(queries)} panel queries returned series from a real Prometheus while "
          f"{TRAINING} ran ({rounds} rounds); {len(expected)} alert rules healthy; targets: operator "
          f"{targets['operator'][0]['scrapeUrl']}, rank 0 {targets['trainers'][0]['scrapeUrl']}; "
          f"{time.monotonic() - t0:.0f} s")
