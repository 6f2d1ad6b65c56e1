"""The Prometheus add-on's objects (make cluster-up PROMETHEUS=1): a real Prometheus server that scrapes the
operator and the trainers the way the chart tells a Prometheus to, and evaluates the chart's alert rules.

Namespace pets-prometheus: a ServiceAccount with read access to pods, services and endpoints (its
Kubernetes service discovery), a ConfigMap with prometheus.yml and the rule files, a one-replica
Deployment of Debian's `prometheus` (the image addons-build.sh prometheus builds), a ClusterIP Service
http://prometheus.pets-prometheus.svc:9090.

No Prometheus Operator runs here, so the chart's monitoring.coreos.com objects are translated, the way
the Prometheus Operator generates its own configuration (v0.7x, pkg/prometheus/promcfg.go), into
prometheus.yml:
- a ServiceMonitor -> a scrape job `serviceMonitor/NS/NAME/I` with `role: endpoints`, its namespaceSelector
  as the discovery's namespaces, its selector's matchLabels as `keep` rules on the Service's labels, its
  port as a `keep` on the endpoint's port name, the operator's target labels (namespace, service, pod,
  container, endpoint; job = the Service's name), then the endpoint's relabelings and metricRelabelings;
- a PodMonitor -> `podMonitor/NS/NAME/I` with `role: pod`, the same with the pod's labels and container
  port name, job = NS/NAME before the endpoint's own relabelings (the chart's set job);
- a PrometheusRule -> a rule file of its spec.groups, as they are.
The monitors' interval, scrapeTimeout and path carry over. matchExpressions, targetPort, TLS and auth are
not translated: the chart renders none, and a monitor that has them is refused rather than half-read.

usage: helm template ... | prometheus_manifests.py --image IMG   (the rendered chart on stdin)
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from typing import Any

from addon_manifests import (
    CONFIG_CHECKSUM_ANNOTATION,
    cluster_service,
    dump,
    load,
    restricted_security_context,
)

Doc = dict[str, Any]

NAMESPACE = "pets-prometheus"
NAME = "prometheus"  # the ServiceAccount, the ConfigMap, the Deployment, its container, the Service
PORT = 9090
URI = f"http://{NAME}.{NAMESPACE}.svc:{PORT}"
LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "pets-training-tests"}
CONFIG_DIR = "/etc/prometheus"
CONFIG_FILE = "prometheus.yml"
DATA = "/prometheus"
SCRAPE_INTERVAL = "30s"  # the Prometheus Operator's default, for a monitor that names none
EVALUATION_INTERVAL = "15s"
REQUESTS = {"cpu": "50m", "memory": "128Mi"}
LIMITS = {"memory": "1Gi"}
# What a relabeling is called in a monitor (camelCase) and in prometheus.yml.
RELABEL_FIELDS = {"sourceLabels": "source_labels", "separator": "separator", "targetLabel": "target_label",
                  "regex": "regex", "modulus": "modulus", "replacement": "replacement", "action": "action"}
UNTRANSLATED = ("targetPort", "tlsConfig", "bearerTokenSecret", "bearerTokenFile", "basicAuth",
                "authorization", "oauth2", "params", "proxyUrl")


class Untranslatable(ValueError):
    """A monitor asks for something this translation does not do."""


def label_name(label: str) -> str:
    """A Kubernetes label as service discovery spells it in its meta labels."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def relabelings(items: list[Doc]) -> list[Doc]:
    """A monitor's relabelings (camelCase, actions in any case) as prometheus.yml's relabel_configs."""
    out = []
    for item in items:
        unknown = set(item) - set(RELABEL_FIELDS)
        if unknown:
            raise Untranslatable(f"relabeling fields {sorted(unknown)} in {item}")
        rule = {RELABEL_FIELDS[k]: v for k, v in item.items()}
        if "action" in rule:
            rule["action"] = str(rule["action"]).lower()
        out.append(rule)
    return out


def selector_rules(selector: Doc, meta: str, monitor: str) -> list[Doc]:
    """`keep` rules for a label selector on the discovered object's labels (meta: its meta-label prefix)."""
    if selector.get("matchExpressions"):
        raise Untranslatable(f"{monitor}: selector.matchExpressions is not translated")
    return [{"action": "keep", "source_labels": [f"{meta}_label_{label_name(k)}",
                                                 f"{meta}_labelpresent_{label_name(k)}"],
             "regex": f"({re.escape(str(v))});true"}
            for k, v in sorted((selector.get("matchLabels") or {}).items())]


def discovery(role: str, monitor: Doc) -> Doc:
    """kubernetes_sd_configs for a monitor's namespaceSelector: any, the names given, else its own."""
    ns_selector = monitor["spec"].get("namespaceSelector") or {}
    sd: Doc = {"role": role}
    if not ns_selector.get("any"):
        names = ns_selector.get("matchNames") or [monitor["metadata"]["namespace"]]
        sd["namespaces"] = {"names": list(names)}
    return sd


def scrape_basics(endpoint: Doc, monitor: str) -> Doc:
    """What an endpoint says of how to scrape: interval, timeout, path, scheme."""
    untranslated = [k for k in UNTRANSLATED if k in endpoint]
    if untranslated:
        raise Untranslatable(f"{monitor}: endpoint fields {untranslated} are not translated")
    if "port" not in endpoint:
        raise Untranslatable(f"{monitor}: an endpoint without a named port")
    job: Doc = {"scrape_interval": endpoint.get("interval") or SCRAPE_INTERVAL}
    if endpoint.get("scrapeTimeout"):
        job["scrape_timeout"] = endpoint["scrapeTimeout"]
    job["metrics_path"] = endpoint.get("path") or "/metrics"
    job["scheme"] = endpoint.get("scheme") or "http"
    return job


def finished_pods() -> Doc:
    """Drop the targets of pods that have finished (their last scrape would fail)."""
    return {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}


def finish_job(job: Doc, rules: list[Doc], endpoint: Doc, job_label: str | None) -> Doc:
    """What both monitor kinds end a scrape job with: `job` from the jobLabel's meta label (when set), the
    endpoint label, then the endpoint's own relabelings and metric relabelings."""
    if job_label:
        rules.append({"source_labels": [job_label], "target_label": "job", "regex": "(.+)",
                      "replacement": "${1}"})
    rules.append({"target_label": "endpoint", "replacement": endpoint["port"]})
    job["relabel_configs"] = rules + relabelings(endpoint.get("relabelings") or [])
    if endpoint.get("metricRelabelings"):
        job["metric_relabel_configs"] = relabelings(endpoint["metricRelabelings"])
    return job


def service_monitor_jobs(monitor: Doc) -> list[Doc]:
    """A ServiceMonitor's scrape jobs, one per endpoint (role endpoints)."""
    ns, name = monitor["metadata"]["namespace"], monitor["metadata"]["name"]
    spec = monitor["spec"]
    jobs = []
    for i, endpoint in enumerate(spec.get("endpoints") or []):
        where = f"ServiceMonitor {ns}/{name}"
        job = {"job_name": f"serviceMonitor/{ns}/{name}/{i}", **scrape_basics(endpoint, where),
               "kubernetes_sd_configs": [discovery("endpoints", monitor)]}
        job_label = spec.get("jobLabel")
        rules = selector_rules(spec.get("selector") or {}, "__meta_kubernetes_service", where) + [
            {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"],
             "regex": endpoint["port"]},
            {"source_labels": ["__meta_kubernetes_endpoint_address_target_kind",
                               "__meta_kubernetes_endpoint_address_target_name"],
             "separator": ";", "regex": "Node;(.*)", "replacement": "${1}", "target_label": "node"},
            {"source_labels": ["__meta_kubernetes_endpoint_address_target_kind",
                               "__meta_kubernetes_endpoint_address_target_name"],
             "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"},
            finished_pods(),
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job",
             "replacement": "${1}"},
        ]
        source = f"__meta_kubernetes_service_label_{label_name(job_label)}" if job_label else None
        jobs.append(finish_job(job, rules, endpoint, source))
    return jobs


def pod_monitor_jobs(monitor: Doc) -> list[Doc]:
    """A PodMonitor's scrape jobs, one per podMetricsEndpoint (role pod)."""
    ns, name = monitor["metadata"]["namespace"], monitor["metadata"]["name"]
    spec = monitor["spec"]
    jobs = []
    for i, endpoint in enumerate(spec.get("podMetricsEndpoints") or []):
        where = f"PodMonitor {ns}/{name}"
        job = {"job_name": f"podMonitor/{ns}/{name}/{i}", **scrape_basics(endpoint, where),
               "kubernetes_sd_configs": [discovery("pod", monitor)]}
        rules = selector_rules(spec.get("selector") or {}, "__meta_kubernetes_pod", where) + [
            {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
             "regex": endpoint["port"]},
            finished_pods(),
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"target_label": "job", "replacement": f"{ns}/{name}"},
        ]
        job_label = spec.get("jobLabel")
        source = f"__meta_kubernetes_pod_label_{label_name(job_label)}" if job_label else None
        jobs.append(finish_job(job, rules, endpoint, source))
    return jobs


def rule_files(chart: list[Doc]) -> dict[str, Doc]:
    """Each PrometheusRule's groups as a rule file, by file name (rules-NS-NAME.yaml)."""
    return {f"rules-{d['metadata']['namespace']}-{d['metadata']['name']}.yaml":
            {"groups": d["spec"]["groups"]} for d in chart if d.get("kind") == "PrometheusRule"}


def config(chart: list[Doc], evaluation_interval: str = EVALUATION_INTERVAL) -> Doc:
    """prometheus.yml for the monitors of a rendered chart (their namespaces must be set, as helm's are)."""
    jobs: list[Doc] = []
    for doc in chart:
        if doc.get("kind") == "ServiceMonitor":
            jobs += service_monitor_jobs(doc)
        elif doc.get("kind") == "PodMonitor":
            jobs += pod_monitor_jobs(doc)
    return {"global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": evaluation_interval},
            "rule_files": [f"{CONFIG_DIR}/{f}" for f in sorted(rule_files(chart))],
            "scrape_configs": jobs}


def prometheus(image: str, chart: list[Doc], evaluation_interval: str = EVALUATION_INTERVAL) -> list[Doc]:
    meta = {"namespace": NAMESPACE, "labels": dict(LABELS)}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": {
        **LABELS, "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/warn": "restricted"}}}
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, **meta}}
    # What kubernetes_sd_configs reads (roles pod and endpoints), in every namespace.
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": f"pets-tests-{NAME}", "labels": dict(LABELS)},
            "rules": [{"apiGroups": [""], "resources": ["pods", "services", "endpoints"],
                       "verbs": ["get", "list", "watch"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": f"pets-tests-{NAME}", "labels": dict(LABELS)},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": f"pets-tests-{NAME}"},
               "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]}
    files = {CONFIG_FILE: dump([config(chart, evaluation_interval)]),
             **{name: dump([groups]) for name, groups in rule_files(chart).items()}}
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NAME, **meta}, "data": files}
    pod_sc, ctr_sc = restricted_security_context()
    ctr = {
        "name": NAME,
        "image": image,
        "imagePullPolicy": "Never",
        "args": [f"--config.file={CONFIG_DIR}/{CONFIG_FILE}", f"--storage.tsdb.path={DATA}",
                 "--storage.tsdb.retention.time=6h", f"--web.listen-address=:{PORT}"],
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/-/ready", "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/-/healthy", "port": "http"}, "periodSeconds": 10,
                          "failureThreshold": 6},
        "resources": {"requests": dict(REQUESTS), "limits": dict(LIMITS)},
        "securityContext": ctr_sc,
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                         {"name": "data", "mountPath": DATA}],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, **meta},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # one TSDB writer at a time
            "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
            # (a new configuration restarts the server: it reads its files at start)
            "template": {"metadata": {"labels": dict(LABELS), "annotations": {
                CONFIG_CHECKSUM_ANNOTATION: hashlib.sha256(dump([files]).encode()).hexdigest()}}, "spec": {
                "serviceAccountName": NAME,
                "automountServiceAccountToken": True,  # its service discovery's credentials
                "enableServiceLinks": False,
                "securityContext": pod_sc,
                "containers": [ctr],
                "volumes": [{"name": "config", "configMap": {"name": NAME}},
                            {"name": "data", "emptyDir": {}}],
            }},
        },
    }
    service = cluster_service(NAME, meta, "http", PORT)
    return [namespace, account, role, binding, configmap, deployment, service]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", required=True)
    ap.add_argument("--evaluation-interval", default=EVALUATION_INTERVAL)
    args = ap.parse_args(argv)
    chart = load(sys.stdin.read())
    if not any(d.get("kind") in ("ServiceMonitor", "PodMonitor") for d in chart):
        ap.error("no ServiceMonitor or PodMonitor on stdin: render the chart with "
                 "metrics.serviceMonitor.enabled and metrics.podMonitor.enabled")
    try:
        sys.stdout.write(dump(prometheus(args.image, chart, args.evaluation_interval)))
    except Untranslatable as exc:
        ap.error(str(exc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
