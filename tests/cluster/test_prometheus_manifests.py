"""prometheus_manifests.py: the Prometheus add-on's objects, and its translation of the chart's
ServiceMonitor, PodMonitor and PrometheusRule into prometheus.yml. That the real server discovers and
scrapes with it (the operator, rank 0 only of a training) is tests/e2e/test_dashboard.py's, on the cluster
(`cluster.sh addon-up prometheus`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import prometheus_manifests as pm  # noqa: E402

pytestmark = pytest.mark.unit

CHART = HERE.parents[1] / "charts" / "pets-training"
RELEASE, RELEASE_NAMESPACE = "pets", "pets-system"
OPERATOR_JOB, TRAINER_JOB = "pets-pets-training", "pets-pets-training-trainers"  # what the dashboard reads


def helm() -> str:
    candidate = Path(os.environ.get("PETS_CACHE", Path.home() / ".cache" / "pets-training")) / "bin" / "helm"
    found = str(candidate) if candidate.is_file() else shutil.which("helm")
    if not found:
        pytest.fail(f"helm not found at {candidate} nor on PATH: tests/cluster/build.sh builds it")
    return found


@pytest.fixture(scope="module")
def chart() -> list[dict[str, Any]]:
    """The chart with its monitoring on, as addons.sh renders it for the add-on."""
    result = subprocess.run([helm(), "template", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE,
                             "--values", str(CHART / "ci" / "monitoring-values.yaml"),
                             "--set", "metrics.serviceMonitor.interval=5s,metrics.podMonitor.interval=5s"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in docs}


def configmap_files(chart: list[dict[str, Any]]) -> dict[str, Any]:
    docs = by_kind(list(yaml.safe_load_all(pm.dump(pm.prometheus("img", chart)))))
    return {name: yaml.safe_load(text) for name, text in docs["ConfigMap"]["data"].items()}


def job(config: dict[str, Any], prefix: str) -> dict[str, Any]:
    (found,) = [j for j in config["scrape_configs"] if j["job_name"].startswith(prefix)]
    return found


def targets_of(rules: list[dict[str, Any]], label: str) -> list[str]:
    return [r.get("replacement", "") for r in rules if r.get("target_label") == label]


def test_the_operator_is_scraped_as_its_servicemonitor_says(chart: list[dict[str, Any]]) -> None:
    monitor = by_kind(chart)["ServiceMonitor"]
    scrape = job(configmap_files(chart)[pm.CONFIG_FILE], f"serviceMonitor/{RELEASE_NAMESPACE}/")
    assert scrape["scrape_interval"] == "5s" and scrape["metrics_path"] == "/metrics"
    assert scrape["kubernetes_sd_configs"] == [{"role": "endpoints",
                                                "namespaces": {"names": [RELEASE_NAMESPACE]}}]
    rules = scrape["relabel_configs"]
    kept = {tuple(r["source_labels"]): r["regex"] for r in rules if r.get("action") == "keep"}
    for key, value in monitor["spec"]["selector"]["matchLabels"].items():
        meta = pm.label_name(key)
        assert kept[(f"__meta_kubernetes_service_label_{meta}",
                     f"__meta_kubernetes_service_labelpresent_{meta}")] == f"({re.escape(value)});true"
    assert kept[("__meta_kubernetes_endpoint_port_name",)] == "http-metrics"
    # job = the Service's name: the chart's operator job, which its dashboard and rules read
    (job_rule,) = [r for r in rules if r.get("target_label") == "job"]
    assert job_rule["source_labels"] == ["__meta_kubernetes_service_name"]
    assert monitor["metadata"]["name"] == OPERATOR_JOB


def test_the_trainers_rank_0_is_scraped_as_the_podmonitor_says(chart: list[dict[str, Any]]) -> None:
    monitor = by_kind(chart)["PodMonitor"]
    scrape = job(configmap_files(chart)[pm.CONFIG_FILE], f"podMonitor/{RELEASE_NAMESPACE}/")
    assert scrape["kubernetes_sd_configs"] == [{"role": "pod"}]  # namespaceSelector any: every namespace
    rules = scrape["relabel_configs"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    # the chart's own relabelings (rank 0 kept, the training's name, job) come last, as they are
    assert rules[-len(endpoint["relabelings"]):] == pm.relabelings(endpoint["relabelings"])
    assert {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
            "regex": "metrics"} in rules
    # the operator's default job (NS/NAME) first, the chart's after it: the chart's name wins
    assert targets_of(rules, "job") == [f"{RELEASE_NAMESPACE}/{TRAINER_JOB}", TRAINER_JOB]
    assert pm.finished_pods() in rules


def test_the_alert_rules_are_the_prometheusrule_s_groups_and_promtool_accepts_them(
        chart: list[dict[str, Any]], tmp_path: Path) -> None:
    files = configmap_files(chart)
    config = files[pm.CONFIG_FILE]
    (rule_file,) = [name for name in files if name != pm.CONFIG_FILE]
    assert config["rule_files"] == [f"{pm.CONFIG_DIR}/{rule_file}"]
    assert files[rule_file] == {"groups": by_kind(chart)["PrometheusRule"]["spec"]["groups"]}
    promtool = subprocess.run([str(HERE.parents[0] / "unit" / "chart" / "promtool.sh")],
                              capture_output=True, text=True, timeout=600)
    assert promtool.returncode == 0, promtool.stderr
    (tmp_path / rule_file).write_text(yaml.safe_dump(files[rule_file]))
    check = subprocess.run([promtool.stdout.split()[-1], "check", "rules", str(tmp_path / rule_file)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_service_discovery_may_read_what_it_watches_and_a_new_config_restarts_the_server(
        chart: list[dict[str, Any]]) -> None:
    docs = by_kind(pm.prometheus("img", chart))
    (rule,) = docs["ClusterRole"]["rules"]
    assert {"pods", "services", "endpoints"} <= set(rule["resources"])
    assert set(rule["verbs"]) == {"get", "list", "watch"}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    subject = {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": pm.NAMESPACE}
    assert docs["ClusterRoleBinding"]["subjects"] == [subject]
    assert docs["Namespace"]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"

    def checksum(docs: dict[str, Any]) -> str:
        return str(docs["Deployment"]["spec"]["template"]["metadata"]["annotations"]
                   [pm.CONFIG_CHECKSUM_ANNOTATION])
    assert checksum(docs) != checksum(by_kind(pm.prometheus("img", chart, evaluation_interval="1m")))


def test_a_monitor_it_cannot_translate_is_refused_not_half_read(chart: list[dict[str, Any]]) -> None:
    monitor = by_kind(chart)["PodMonitor"]
    with_expressions = {**monitor, "spec": {**monitor["spec"], "selector": {
        "matchExpressions": [{"key": "a", "operator": "Exists"}]}}}
    with pytest.raises(pm.Untranslatable, match="matchExpressions"):
        pm.pod_monitor_jobs(with_expressions)
    endpoint = {**monitor["spec"]["podMetricsEndpoints"][0], "basicAuth": {}}
    with pytest.raises(pm.Untranslatable, match="basicAuth"):
        pm.pod_monitor_jobs({**monitor, "spec": {**monitor["spec"], "podMetricsEndpoints": [endpoint]}})
