"""The chart rendered by the real helm: lint, every ci/ variant, RBAC, security and the schema."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from pets_operator import api, builders, crd, rbac

from .support import CHART, NAMESPACE, RELEASE, Manifest, of_kind, one, render, run_helm, template_args

pytestmark = pytest.mark.unit

CI_VALUES = sorted(f"ci/{p.name}" for p in (CHART / "ci").glob("*-values.yaml"))
VARIANTS = [None, *CI_VALUES]  # None: the chart's defaults

# What the operator may do inside a namespace it watches, as (apiGroup, resource, verb): exactly what
# pets_operator.rbac says its code uses. The PyTorchJob and Kueue grants are switched by rbac.pytorchJobs
# and rbac.kueue.
USED = {(group, resource, verb) for group, resource, verbs in rbac.NAMESPACED for verb in verbs}
PYTORCHJOBS = {grant for grant in USED if grant[0] == "kubeflow.org"}
KUEUE = {grant for grant in USED if grant[0] == "kueue.x-k8s.io"}
NEEDED_IN_NAMESPACE = USED - PYTORCHJOBS - KUEUE
NAMESPACED_PEERING = {("kopf.dev", "kopfpeerings", v) for v in ("get", "list", "watch", "patch")}
CLUSTER_ONLY = {("", "namespaces", v) for v in ("list", "watch")} | {
    ("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("list", "watch")
}
CLUSTER_PEERING = {("kopf.dev", "clusterkopfpeerings", v) for v in ("get", "list", "watch", "patch")}
# Cluster-scoped reads both modes need: get nodes (is a stuck pod's node lost?), switched by rbac.nodes,
# and list storageclasses (has the cluster a default one?), switched by rbac.storageClasses.
CLUSTER_READS = {(group, resource, verb) for group, resource, verbs in rbac.CLUSTER for verb in verbs}
NODES = {grant for grant in CLUSTER_READS if grant[1] == "nodes"}
STORAGE_CLASSES = {grant for grant in CLUSTER_READS if grant[1] == "storageclasses"}


def grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def rbac_objects(manifest: Manifest) -> Manifest:
    kinds = {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    return [d for d in manifest if d["kind"] in kinds]


def container(manifest: Manifest) -> dict[str, Any]:
    containers = one(manifest, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return containers[0]


def values_of(variant: str | None) -> dict[str, Any]:
    return yaml.safe_load((CHART / variant).read_text()) if variant else {}


# ---------------------------------------------------------------- lint


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_helm_lint_strict_passes(helm: str, variant: str | None) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", NAMESPACE]
    if variant:
        args += ["--values", str(CHART / variant)]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout, result.stdout


def test_ci_variants_cover_the_modes() -> None:
    names = {v.removeprefix("ci/") for v in CI_VALUES}
    assert {"namespaced-values.yaml", "metrics-off-values.yaml", "standalone-values.yaml"} <= names


# ---------------------------------------------------------------- RBAC


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_rbac_has_no_wildcards(helm: str, variant: str | None) -> None:
    manifest = render(helm, *([variant] if variant else []))
    rules = [r for d in rbac_objects(manifest) if "rules" in d for r in d["rules"]]
    assert rules, "no RBAC rules rendered"
    for rule in rules:
        for field in ("apiGroups", "resources", "verbs"):
            assert not any("*" in item for item in rule[field]), f"wildcard in {field}: {rule}"
        assert "nonResourceURLs" not in rule, rule


def test_cluster_mode_grants_exactly_what_the_operator_needs(helm: str) -> None:
    manifest = render(helm)
    assert not of_kind(manifest, "Role") and not of_kind(manifest, "RoleBinding")
    role = one(manifest, "ClusterRole")
    assert grants(role["rules"]) == (NEEDED_IN_NAMESPACE | PYTORCHJOBS | KUEUE | CLUSTER_ONLY
                                     | CLUSTER_PEERING | CLUSTER_READS)
    binding = one(manifest, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    sa = one(manifest, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}
    ]


def test_namespaced_mode_renders_only_roles_in_each_watched_namespace(helm: str) -> None:
    manifest = render(helm, "ci/namespaced-values.yaml")
    watched = values_of("ci/namespaced-values.yaml")["watch"]["namespaces"]
    assert len(watched) >= 2
    # Cluster-wide, only get on nodes and list on storageclasses, in a ClusterRole of their own.
    reads_role, reads_binding = one(manifest, "ClusterRole"), one(manifest, "ClusterRoleBinding")
    assert reads_role["metadata"]["name"].endswith("-cluster-reads")
    assert grants(reads_role["rules"]) == CLUSTER_READS
    assert reads_binding["roleRef"]["name"] == reads_role["metadata"]["name"]
    assert reads_binding["subjects"] == [
        {"kind": "ServiceAccount", "name": one(manifest, "ServiceAccount")["metadata"]["name"],
         "namespace": NAMESPACE}]
    no_nodes = render(helm, "ci/namespaced-values.yaml", set_values=("rbac.nodes=false",))
    assert grants(one(no_nodes, "ClusterRole")["rules"]) == STORAGE_CLASSES
    no_classes = render(helm, "ci/namespaced-values.yaml", set_values=("rbac.storageClasses=false",))
    assert grants(one(no_classes, "ClusterRole")["rules"]) == NODES
    bare = render(helm, "ci/namespaced-values.yaml",
                  set_values=("rbac.nodes=false", "rbac.storageClasses=false"))
    assert not of_kind(bare, "ClusterRole") and not of_kind(bare, "ClusterRoleBinding")
    assert not [d for d in manifest if d["kind"] == "ClusterKopfPeering"]
    roles = of_kind(manifest, "Role")
    bindings = of_kind(manifest, "RoleBinding")
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(watched)
    assert sorted(b["metadata"]["namespace"] for b in bindings) == sorted(watched)
    sa_name = one(manifest, "ServiceAccount")["metadata"]["name"]
    for role in roles:
        assert grants(role["rules"]) == NEEDED_IN_NAMESPACE | PYTORCHJOBS | KUEUE | NAMESPACED_PEERING
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa_name, "namespace": NAMESPACE}]
    peerings = of_kind(manifest, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == sorted(watched)
    args = container(manifest)["args"]
    assert [a for a in args if a.startswith("--namespace=")] == [f"--namespace={ns}" for ns in watched]


@pytest.mark.parametrize("variant", [None, "ci/namespaced-values.yaml"], ids=str)
def test_chart_grants_what_the_operator_code_uses(helm: str, variant: str | None) -> None:
    """pets_operator.rbac lists the permissions the operator's code uses; the chart grants them all."""
    manifest = render(helm, *([variant] if variant else []))
    roles = [r for r in of_kind(manifest, "ClusterRole") + of_kind(manifest, "Role")
             if not r["metadata"]["name"].endswith("-cluster-reads")]
    assert roles
    assert CLUSTER_READS <= grants([rule for r in of_kind(manifest, "ClusterRole") for rule in r["rules"]])
    for role in roles:
        missing = USED - grants(role["rules"])
        assert not missing, f"{role['kind']} {role['metadata']['name']} lacks {sorted(missing)}"


def test_standalone_without_pytorchjobs_drops_those_grants(helm: str) -> None:
    manifest = render(helm, "ci/standalone-values.yaml")
    role = one(manifest, "ClusterRole")
    assert grants(role["rules"]) == NEEDED_IN_NAMESPACE | KUEUE | CLUSTER_ONLY | CLUSTER_READS
    assert not [d for d in manifest if d["apiVersion"].startswith("kopf.dev/")]
    assert not of_kind(manifest, "CustomResourceDefinition")
    args = container(manifest)["args"]
    assert "--standalone" in args and not any(a.startswith("--peering") for a in args)


def test_extra_rules_are_appended(helm: str) -> None:
    manifest = render(
        helm,
        set_values=(
            "rbac.extraRules[0].apiGroups={}",
            "rbac.extraRules[0].resources={configmaps}",
            "rbac.extraRules[0].verbs={get,list}",
        ),
    )
    assert ("", "configmaps", "get") in grants(one(manifest, "ClusterRole")["rules"])


@pytest.mark.parametrize(("switch", "left_out"),
                         [("rbac.nodes", NODES), ("rbac.storageClasses", STORAGE_CLASSES)])
def test_cluster_mode_cluster_reads_are_switched(helm: str, switch: str,
                                                 left_out: set[tuple[str, str, str]]) -> None:
    full = grants(one(render(helm), "ClusterRole")["rules"])
    off = grants(one(render(helm, set_values=(f"{switch}=false",)), "ClusterRole")["rules"])
    assert off == full - left_out


def test_rbac_off_renders_no_rbac(helm: str) -> None:
    assert not rbac_objects(render(helm, set_values=("rbac.create=false",)))


# ---------------------------------------------------------------- the operator Deployment


def test_deployment_defaults(helm: str) -> None:
    manifest = render(helm)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    deployment = one(manifest, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    c = container(manifest)
    assert c["image"] == f"pets-training/operator:{chart['appVersion']}"
    assert c["imagePullPolicy"] == "IfNotPresent"
    assert c["args"][0] == "run"
    assert "--peering=pets-training" in c["args"]
    assert "--priority=auto" in c["args"]  # replicas of the Deployment must not tie (see docs/chart.md)
    assert "--liveness-port=8080" in c["args"] and "--metrics-port=8000" in c["args"]
    assert not any(a.startswith("--namespace") for a in c["args"])
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "http-health"}
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http-health": 8080, "http-metrics": 8000}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert c["resources"]["limits"]["cpu"] == "2"  # checkov CKV_K8S_11; docs/chart.md says why 2
    assert pod["serviceAccountName"] == one(manifest, "ServiceAccount")["metadata"]["name"]
    labels = deployment["spec"]["selector"]["matchLabels"]
    assert labels.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert one(manifest, "Service")["spec"]["selector"] == labels
    assert {e["name"] for e in c["env"]} >= {"POD_ID"}


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_security_context_is_restricted(helm: str, variant: str | None) -> None:
    manifest = render(helm, *([variant] if variant else []))
    pod = one(manifest, "Deployment")["spec"]["template"]["spec"]
    psc = pod["securityContext"]
    # The operator image's user: above every host user's uid (checkov CKV_K8S_40).
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] == psc["runAsGroup"] == psc["fsGroup"] == 65532
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(manifest)["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["runAsNonRoot"] is True
    # The read-only root needs a writable /tmp.
    assert {"name": "tmp", "mountPath": "/tmp"} in container(manifest)["volumeMounts"]


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_operator_cli_accepts_the_rendered_args(helm: str, variant: str | None) -> None:
    """The args the chart passes are parsed by the operator's real argument parser."""
    from pets_operator.cli import build_parser

    manifest = render(helm, *([variant] if variant else []))
    c = container(manifest)
    args = build_parser().parse_args(c["args"])
    values = values_of(variant)
    assert args.command == "run"
    assert list(args.namespace) == values.get("watch", {}).get("namespaces", [])
    metrics_on = values.get("metrics", {}).get("enabled", True)
    assert args.metrics_port == (8000 if metrics_on else 0)
    assert args.liveness_port == 8080
    peering_on = values.get("peering", {}).get("enabled", True)
    assert args.standalone is (not peering_on)
    assert args.default_output == "managedClaim"
    assert args.default_output_claim_size == "5Gi" and args.default_output_storage_class == ""


def test_metrics_off(helm: str) -> None:
    manifest = render(helm, "ci/metrics-off-values.yaml")
    ports = one(manifest, "Service")["spec"]["ports"]
    assert [p["name"] for p in ports] == ["http-health"]
    assert [p["name"] for p in container(manifest)["ports"]] == ["http-health"]
    assert not of_kind(manifest, "ServiceMonitor")


def test_service_monitor(helm: str) -> None:
    manifest = render(helm, "ci/servicemonitor-values.yaml")
    monitor = one(manifest, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "http-metrics"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"] == one(manifest, "Service")["spec"]["selector"]
    assert not of_kind(render(helm), "ServiceMonitor")


def test_image_tag_and_digest(helm: str) -> None:
    tagged = container(render(helm, set_values=("image.registry=reg.example:5000", "image.tag=1.2.3")))
    assert tagged["image"] == "reg.example:5000/pets-training/operator:1.2.3"
    digest = "sha256:" + "a" * 64
    assert container(render(helm, set_values=(f"image.digest={digest}",)))["image"].endswith(f"@{digest}")


# ---------------------------------------------------------------- peering


def test_cluster_mode_peering_objects_and_crds(helm: str) -> None:
    manifest = render(helm)
    crds = {d["metadata"]["name"]: d for d in of_kind(manifest, "CustomResourceDefinition")}
    assert set(crds) == {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}
    assert crds["clusterkopfpeerings.kopf.dev"]["spec"]["scope"] == "Cluster"
    assert crds["kopfpeerings.kopf.dev"]["spec"]["scope"] == "Namespaced"
    peering = one(manifest, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "pets-training"
    assert "post-install" in peering["metadata"]["annotations"]["helm.sh/hook"]
    assert not of_kind(manifest, "KopfPeering")
    no_crds = render(helm, set_values=("peering.crds.create=false",))
    assert not of_kind(no_crds, "CustomResourceDefinition")
    assert of_kind(no_crds, "ClusterKopfPeering")


def test_the_immutability_policy_is_installed_unless_turned_off(helm: str) -> None:
    kinds = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")

    def immutability(manifest: Manifest) -> Manifest:
        return [d for d in manifest
                if d["kind"] in kinds and d["metadata"]["name"] == api.IMMUTABILITY_POLICY]

    assert immutability(render(helm)) == crd.immutability_policy()
    off = render(helm, set_values=("immutabilityPolicy.create=false",))
    assert not immutability(off)
    assert of_kind(off, "ValidatingAdmissionPolicy"), "the guardrails policy is another switch's"


# ---------------------------------------------------------------- the helm test pod and names


def test_helm_test_pod(helm: str) -> None:
    manifest = render(helm)
    pods = of_kind(manifest, "Pod")
    assert len(pods) == 1
    pod = pods[0]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    service = one(manifest, "Service")["metadata"]["name"]
    script = pod["spec"]["containers"][0]["args"][0]
    assert f"http://{service}.{NAMESPACE}.svc:8080/healthz" in script
    assert f"http://{service}.{NAMESPACE}.svc:8000/metrics" in script
    compile(script, "helm-test", "exec")  # the check is valid Python
    # The test pod must not be selected by the operator's Service.
    selector = one(manifest, "Service")["spec"]["selector"]
    assert not selector.items() <= pod["metadata"]["labels"].items()
    assert not of_kind(render(helm, set_values=("tests.enabled=false",)), "Pod")
    # Locked down like the operator: its uid, a read-only root, no token, CPU and memory limits.
    assert pod["spec"]["securityContext"]["runAsUser"] == 65532
    assert pod["spec"]["automountServiceAccountToken"] is False
    (check,) = pod["spec"]["containers"]
    assert check["securityContext"]["readOnlyRootFilesystem"] is True
    assert set(check["resources"]["limits"]) == {"cpu", "memory"}


def test_names_are_release_scoped(helm: str) -> None:
    manifest = render(helm)
    expected = f"{RELEASE}-pets-training"
    for doc in manifest:
        if doc["kind"] in {"Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}:
            assert doc["metadata"]["name"] == expected, doc["kind"]
            assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    override = render(helm, set_values=("fullnameOverride=op",))
    assert one(override, "Deployment")["metadata"]["name"] == "op"


def test_default_output_values_become_the_operator_args(helm: str) -> None:
    from pets_operator.cli import build_parser

    rendered = container(render(helm))["args"]
    args = build_parser().parse_args(rendered)
    assert args.default_output == "managedClaim"
    assert args.default_output_claim_size == api.DEFAULT_OUTPUT_CLAIM_SIZE
    assert not [a for a in rendered if a.startswith("--default-output-storage-class")]
    c = container(render(helm, set_values=(
        "defaultOutput.managedClaim.enabled=false",
        "defaultOutput.managedClaim.size=20Gi",
        "defaultOutput.managedClaim.storageClassName=fast-ssd",
    )))
    args = build_parser().parse_args(c["args"])
    assert args.default_output == "emptyDir"
    assert (args.default_output_claim_size, args.default_output_storage_class) == ("20Gi", "fast-ssd")


def test_default_output_schema_admits_what_the_crd_admits() -> None:
    """The chart's patterns for the default claim are the CRD's for spec.output.managedClaim."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    claim = schema["properties"]["defaultOutput"]["properties"]["managedClaim"]["properties"]
    assert claim["size"]["pattern"] == api.QUANTITY
    assert claim["storageClassName"]["pattern"] == f"^$|{api.DNS_SUBDOMAIN}"


# ---------------------------------------------------------------- values.schema.json


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("watch.namespaces={Not_A_Namespace}", "namespaces"),
        (
            "rbac.extraRules[0].apiGroups={},rbac.extraRules[0].resources={secrets},rbac.extraRules[0].verbs={*}",
            "verbs",
        ),
        (
            "rbac.extraRules[0].apiGroups={},rbac.extraRules[0].resources={*},rbac.extraRules[0].verbs={get}",
            "resources",
        ),
        ("health.port=0", "port"),
        ("metrics.port=70000", "port"),
        ("logFormat=xml", "logFormat"),
        ("replicaCount=-1", "replicaCount"),
        ("peering.enabled=maybe", "enabled"),
        ("peering.priority=high", "priority"),
        ("unknownTopLevel=1", "unknownTopLevel"),
        ("image.digest=latest", "digest"),
        ("metrics.serviceMonitor.interval=often", "interval"),
        ("defaultOutput.managedClaim.enabled=maybe", "enabled"),
        ("defaultOutput.managedClaim.size=lots", "size"),
        ("defaultOutput.managedClaim.storageClassName=Fast_SSD", "storageClassName"),
        ("rbac.storageClasses=yes", "storageClasses"),
    ],
)
def test_bad_values_are_refused_naming_the_field(helm: str, setting: str, named: str) -> None:
    result = run_helm(helm, *template_args(set_values=(setting,)))
    assert result.returncode != 0, f"--set {setting} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert re.search(rf"\b{re.escape(named)}\b", result.stderr), result.stderr


def test_service_account_name_required_when_not_created(helm: str) -> None:
    result = run_helm(helm, *template_args(set_values=("serviceAccount.create=false",)))
    assert result.returncode != 0
    assert "serviceAccount.name" in result.stderr
    manifest = render(helm, set_values=("serviceAccount.create=false", "serviceAccount.name=existing"))
    assert not of_kind(manifest, "ServiceAccount")
    assert one(manifest, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "existing"


def test_network_policy_lets_the_operator_read_progress_and_the_gang_talk(helm: str) -> None:
    assert not of_kind(render(helm), "NetworkPolicy")
    manifest = render(helm, set_values=("networkPolicy.enabled=true", "watch.namespaces={team-a,team-b}"))
    policies = of_kind(manifest, "NetworkPolicy")
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["team-a", "team-b"]
    spec = policies[0]["spec"]
    trainers = {"app.kubernetes.io/component": "trainer", "app.kubernetes.io/managed-by": "pets-operator"}
    assert spec["podSelector"]["matchLabels"] == trainers
    from_operator, from_gang = spec["ingress"]
    (peer,) = from_operator["from"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": NAMESPACE}
    operator_pods = one(manifest, "Deployment")["spec"]["selector"]["matchLabels"]
    assert peer["podSelector"]["matchLabels"] == operator_pods
    assert from_operator["ports"] == [{"protocol": "TCP", "port": api.METRICS_PORT}]
    assert from_gang == {"from": [{"podSelector": {"matchLabels": trainers}}]}
    # The trainer pods the operator builds carry exactly those labels.
    pod = builders.pod_template(api.resolve_spec({}), builders.Target("pets", "team-a"))
    assert trainers.items() <= pod["metadata"]["labels"].items()


def test_each_training_gets_a_policy_that_admits_the_operator_to_its_progress_port(helm: str) -> None:
    """trainingNetworkPolicy: on by default; the operator's own pods (in the release's namespace) come
    first among the peers that may read the trainers' progress port, then metricsFrom (Prometheus)."""
    from pets_operator.cli import build_parser

    manifest = render(helm)
    args = build_parser().parse_args(container(manifest)["args"])
    assert args.training_network_policy == "on"
    operator_pods = one(manifest, "Deployment")["spec"]["selector"]["matchLabels"]
    in_release_namespace = {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
    assert args.metrics_from == ({"namespaceSelector": in_release_namespace,
                                  "podSelector": {"matchLabels": operator_pods}},)
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    more = render(helm, set_values=(
        "trainingNetworkPolicy.enabled=false",
        "trainingNetworkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name"
        "=monitoring"))
    args = build_parser().parse_args(container(more)["args"])
    assert args.training_network_policy == "off"
    assert args.metrics_from[1:] == (prometheus,)
    # The operator may create and delete them (and nothing else of them) in the trainings' namespaces.
    (role,) = [r for r in of_kind(manifest, "ClusterRole") if any(
        "networkpolicies" in rule["resources"] for rule in r["rules"])]
    (rule,) = [rule for rule in role["rules"] if "networkpolicies" in rule["resources"]]
    assert rule["apiGroups"] == ["networking.k8s.io"] and rule["verbs"] == ["create", "delete"]
    wrong = run_helm(helm, *template_args(set_values=("trainingNetworkPolicy.metricsFrom[0].pods=x",)))
    assert wrong.returncode != 0 and "metricsFrom" in wrong.stderr


def test_network_policy_needs_namespaces_in_cluster_mode(helm: str) -> None:
    result = run_helm(helm, *template_args(set_values=("networkPolicy.enabled=true",)))
    assert result.returncode != 0 and "networkPolicy.enabled" in result.stderr
    cluster = render(helm, set_values=("networkPolicy.enabled=true", "networkPolicy.namespaces={ml}"))
    assert [p["metadata"]["namespace"] for p in of_kind(cluster, "NetworkPolicy")] == ["ml"]
