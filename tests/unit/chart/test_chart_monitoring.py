"""The chart's monitoring for the platform (docs/watching.md): the Grafana dashboard's ConfigMap, the
PrometheusRule and the trainers' PodMonitor, all off by default. The rules are checked and tested with
Prometheus's own promtool (Debian's prometheus package, installed by promtool.sh when missing); every
metric the dashboard and the rules name is one the operator or the trainer really serves."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pets_contract import gauges

from .support import Manifest, of_kind, one, render

pytestmark = pytest.mark.unit

HERE = Path(__file__).resolve().parent
MONITORING = ("metrics.podMonitor.enabled=true", "metrics.dashboard.enabled=true",
              "metrics.prometheusRule.enabled=true")
OPERATOR_JOB, TRAINER_JOB = "pets-pets-training", "pets-pets-training-trainers"  # release pets
# Prometheus's own series, and the process collector of the operator's prometheus_client
BUILTIN = {"up", "process_resident_memory_bytes"}
IDENTIFIER = re.compile(r"\b(pets_[a-z0-9_]+|up|process_[a-z_]+)\b(?!\s*\()")


@pytest.fixture(scope="module")
def promtool() -> str:
    """promtool, installed by the project's script when missing (as root); the test fails without it."""
    result = subprocess.run([str(HERE / "promtool.sh")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"promtool.sh failed:\n{result.stderr}"
    return result.stdout.strip().splitlines()[-1]


def served_metrics() -> set[str]:
    """Every sample name the operator's registry serves (histogram buckets included) and the trainer's."""
    from pets_operator import metrics  # noqa: F401  (registers the operator's metrics)
    from prometheus_client import REGISTRY

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names = {family.name + suffix for family in REGISTRY.collect()  # labelled ones have no samples yet
             for suffix in suffixes.get(family.type, ("",))}
    return names | {gauge.name for gauge in gauges.GAUGES} | BUILTIN


def rules_of(manifest: Manifest) -> dict[str, Any]:
    return {"groups": one(manifest, "PrometheusRule")["spec"]["groups"]}


def dashboard_configmap(manifest: Manifest) -> dict[str, Any]:
    return next(d for d in of_kind(manifest, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard"))


def dashboard_of(manifest: Manifest) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(dashboard_configmap(manifest)["data"]["pets-training.json"])
    return data


def queries(dashboard: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_monitoring_is_off_by_default(helm: str) -> None:
    manifest = render(helm)
    assert not of_kind(manifest, "PrometheusRule") and not of_kind(manifest, "PodMonitor")
    assert not [d for d in of_kind(manifest, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]


def test_the_dashboard_ships_for_grafanas_sidecar_with_this_releases_jobs(helm: str) -> None:
    manifest = render(helm, "ci/monitoring-values.yaml")
    configmap = dashboard_configmap(manifest)
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "Training"}
    dashboard = dashboard_of(manifest)
    assert dashboard["uid"] == "pets-training"
    text = json.dumps(dashboard)
    assert "__OPERATOR_JOB__" not in text and "__TRAINER_JOB__" not in text
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert {"Trainings by phase", "Step rate", "Goodput (this attempt)", "Gang restarts", "Reconcile latency",
            "Operator memory", "Progress reads failing", "Prometheus scrapes failing"} <= titles
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]
    for expr in queries(dashboard):
        assert f'job="{OPERATOR_JOB}"' in expr or f'job="{TRAINER_JOB}"' in expr or "job=~" in expr, expr


def test_every_metric_named_is_one_the_operator_or_the_trainer_serves(helm: str) -> None:
    manifest = render(helm, "ci/monitoring-values.yaml")
    exprs = queries(dashboard_of(manifest)) + [rule["expr"] for group in rules_of(manifest)["groups"]
                                               for rule in group["rules"]]
    named = {name for expr in exprs for name in IDENTIFIER.findall(expr)}
    assert named - served_metrics() == set()
    assert {"pets_operator_trainings", "pets_step", "pets_train_seconds_total", "up"} <= named


def test_the_dashboards_queries_parse(helm: str, promtool: str, tmp_path: Path) -> None:
    """Each panel's PromQL as a recording rule, for promtool's parser ($__rate_interval as Grafana's)."""
    exprs = queries(dashboard_of(render(helm, "ci/monitoring-values.yaml")))
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"pets:panel_{i}", "expr": expr.replace("$__rate_interval", "2m")}
        for i, expr in enumerate(exprs)]}]}
    (tmp_path / "dashboard.yaml").write_text(yaml.safe_dump(rules))
    result = subprocess.run([promtool, "check", "rules", str(tmp_path / "dashboard.yaml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_alerts_fire_when_they_should_and_never_on_a_healthy_training(helm: str, promtool: str,
                                                                          tmp_path: Path) -> None:
    """promtool test rules (alerts-test.yaml): a training that stops stepping fires PetsTrainingStalled
    after stalledMinutes, a healthy one, a finishing one and a young one never do; and so on for each."""
    rules = rules_of(render(helm, set_values=("metrics.prometheusRule.enabled=true",)))
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    tested = set(re.findall(r"alertname: (\w+)", (HERE / "alerts-test.yaml").read_text()))
    assert alerts == tested == {"PetsTrainingStalled", "PetsTrainingFailed", "PetsTrainingGoodputLow",
                                "PetsTrainingInputBound",
                                "PetsOperatorDown", "PetsOperatorNotReconciling",
                                "PetsOperatorReconcileErrors", "PetsProgressScrapesFailing",
                                "PetsTrainerScrapesFailing"}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    shutil.copy(HERE / "alerts-test.yaml", tmp_path)
    check = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yaml")],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run([promtool, "test", "rules", str(tmp_path / "alerts-test.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert test.returncode == 0, test.stdout + test.stderr


def test_the_thresholds_and_alert_labels_come_from_values(helm: str, tmp_path: Path) -> None:
    rule = {"enabled": True, "stalledMinutes": 40, "goodputThreshold": 0.3, "inputBoundShare": 0.8,
            "alertLabels": {"severity": "page"}, "operatorJob": "custom-operator"}
    values = {"metrics": {"prometheusRule": rule}}
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    rules = rules_of(render(helm, str(tmp_path / "values.yaml")))
    by_name = {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"]}
    stalled = by_name["PetsTrainingStalled"]["expr"]
    assert "[40m]" in stalled and "offset 40m" in stalled
    assert "< 0.3" in by_name["PetsTrainingGoodputLow"]["expr"]
    input_bound = by_name["PetsTrainingInputBound"]["expr"]
    assert "> 0.8" in input_bound and "[15m]" in input_bound
    assert 'job="custom-operator"' in by_name["PetsOperatorDown"]["expr"]
    assert all(rule["labels"]["severity"] == "page" for rule in by_name.values())


def test_the_pod_monitor_scrapes_rank_0_of_the_watched_namespaces(helm: str) -> None:
    monitor = one(render(helm, "ci/monitoring-values.yaml"), "PodMonitor")
    assert monitor["metadata"]["name"] == TRAINER_JOB
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    assert monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "trainer"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics"  # the trainer container's port 9090 (pets_operator.builders)
    keep, training, job = endpoint["relabelings"]
    assert keep["action"] == "keep"
    assert re.fullmatch(keep["regex"], "0;;") and re.fullmatch(keep["regex"], ";master;0")
    assert not re.fullmatch(keep["regex"], "1;;") and not re.fullmatch(keep["regex"], ";worker;0")
    assert training["targetLabel"] == "training" and job["replacement"] == TRAINER_JOB
    on = ("metrics.podMonitor.enabled=true",)
    namespaced = one(render(helm, "ci/namespaced-values.yaml", set_values=on), "PodMonitor")
    assert namespaced["spec"]["namespaceSelector"]["matchNames"]


@pytest.mark.parametrize("setting", ["metrics.prometheusRule.goodputThreshold=2",
                                     "metrics.prometheusRule.stalledMinutes=0",
                                     "metrics.prometheusRule.inputBoundShare=0"])
def test_bad_thresholds_are_refused(helm: str, setting: str) -> None:
    from .support import run_helm, template_args

    result = run_helm(helm, *template_args(set_values=("metrics.prometheusRule.enabled=true", setting)))
    assert result.returncode != 0 and setting.split(".")[-1].split("=")[0] in result.stderr
