"""The chart against a real kube-apiserver: install, RBAC as granted, dry-run of every variant.

Run under tests/cluster/run-with-control-plane.sh (`make test-integration`), which exports
KUBECONFIG and puts helm first on PATH. There is no kubelet here: the operator's pod is never
scheduled, so these tests check the API objects and the permissions, not the running operator.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pets_operator import api

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "pets-training"
SUFFIX = secrets.token_hex(3)
CI_VALUES = sorted(f"ci/{p.name}" for p in (CHART / "ci").glob("*-values.yaml"))
# Kinds whose CRDs no test cluster here serves (prometheus-operator's): their dry-run is checked
# to fail for that reason only.
FOREIGN_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def tool(name: str) -> str:
    """helm and kubectl from PATH (run-with-control-plane.sh puts $PETS_CACHE/bin first)."""
    found = shutil.which(name)
    if not found:
        pytest.fail(
            f"{name} is not on PATH: run under tests/cluster/run-with-control-plane.sh", pytrace=False
        )
    return found


def run(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=180, check=False)
    if check and result.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def kubectl(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(tool("kubectl"), *args, stdin=stdin, check=check)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(tool("helm"), *args, check=check)


def get_json(*args: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(kubectl("get", *args, "-o", "json").stdout)
    return result


def exists(*args: str) -> bool:
    return kubectl("get", *args, "--ignore-not-found", "-o", "name", check=True).stdout.strip() != ""


def can_i(sa: str, verb: str, resource: str, namespace: str | None, subresource: str = "") -> bool:
    args = ["auth", "can-i", verb, resource, f"--as={sa}"]
    args += ["--namespace", namespace] if namespace else ["--all-namespaces"]
    if subresource:
        args.append(f"--subresource={subresource}")
    result = kubectl(*args, check=False)
    answer = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert answer in {"yes", "no"}, f"kubectl {' '.join(args)}: {result.stdout}{result.stderr}"
    return answer == "yes"


@pytest.fixture(scope="module", autouse=True)
def _api_server() -> None:
    if not os.environ.get("KUBECONFIG"):
        pytest.fail("KUBECONFIG is not set: run under tests/cluster/run-with-control-plane.sh", pytrace=False)
    kubectl("version")


def established(crd: str) -> bool:
    # A CRD file may carry `status: {conditions: null}` (controller-gen writes one) until the server sets it.
    conditions = (get_json("crd", crd).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def wait_established(crd: str, timeout: float = 60.0) -> None:
    # Not `kubectl wait`: it fails at once while a new CRD has no status.conditions yet.
    deadline = time.monotonic() + timeout
    while not established(crd):
        if time.monotonic() > deadline:
            pytest.fail(f"CRD {crd} not Established after {timeout:.0f} s", pytrace=False)
        time.sleep(0.5)


@pytest.fixture(scope="module")
def pytorchjob_crd() -> None:
    """The real Kubeflow PyTorchJob CRD, so `kubectl auth can-i` resolves pytorchjobs.kubeflow.org."""
    crd = run(str(REPO / "tests" / "cluster" / "pytorchjob-crd.sh")).stdout.strip()
    kubectl("apply", "--server-side", "--force-conflicts", "-f", crd)
    wait_established("pytorchjobs.kubeflow.org")


@dataclass
class Release:
    name: str
    namespace: str
    fullname: str
    sa: str  # the username the operator's ServiceAccount authenticates as
    peering: str
    notes: str


@contextlib.contextmanager
def namespaces(*names: str) -> Iterator[list[str]]:
    """These namespaces exist inside the block; the ones it created are deleted after it."""
    created = [n for n in names if not exists("namespace", n)]
    for name in created:
        kubectl("create", "namespace", name)
    try:
        yield list(names)
    finally:
        for name in created:
            kubectl("delete", "namespace", name, "--wait=false")


def install(release: str, ns: str, *settings: str) -> Release:
    peering = f"pets-{SUFFIX}-{release}"[:63]
    # As docs/chart.md says: the immutability policy is cluster-wide, and a second release (of these
    # tests, or the operator tests' own copy) must not try to own it.
    policy_there = exists("validatingadmissionpolicy", api.IMMUTABILITY_POLICY)
    settings = (*settings, f"immutabilityPolicy.create={str(not policy_there).lower()}")
    result = helm(
        "install",
        release,
        str(CHART),
        "--namespace",
        ns,
        "--timeout",
        "3m",
        "--set",
        f"peering.name={peering}",
        *(a for s in settings for a in ("--set", s)),
    )
    fullname = f"{release}-pets-training"
    return Release(release, ns, fullname, f"system:serviceaccount:{ns}:{fullname}", peering, result.stdout)


def uninstall(release: Release) -> None:
    helm("uninstall", release.name, "--namespace", release.namespace, "--wait", "--timeout", "2m")


@pytest.fixture(scope="module")
def cluster_release() -> Iterator[Release]:
    """The chart's defaults (cluster mode, peering, metrics) installed with helm."""
    # As docs/chart.md says: where kopf's peering CRDs are already installed (by another kopf
    # operator, or by the operator's own tests), the release must not try to own them.
    crds_there = exists("crd", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev")
    with namespaces(f"pets-chart-{SUFFIX}") as (ns,):
        release = install(f"pc{SUFFIX}", ns, f"peering.crds.create={str(not crds_there).lower()}")
        yield release
        uninstall(release)


@pytest.fixture(scope="module")
def namespaced_release(cluster_release: Release) -> Iterator[tuple[Release, list[str]]]:
    """Namespaced mode watching two namespaces; the peering CRDs are the cluster release's."""
    with namespaces(f"pets-op-{SUFFIX}", f"pets-a-{SUFFIX}", f"pets-b-{SUFFIX}") as (ns, *watched):
        release = install(
            f"pn{SUFFIX}", ns, f"watch.namespaces={{{','.join(watched)}}}", "peering.crds.create=false"
        )
        yield release, watched
        uninstall(release)


# ---------------------------------------------------------------- install


def test_install_creates_the_objects(cluster_release: Release) -> None:
    r = cluster_release
    ns = ("--namespace", r.namespace)
    for kind in ("deployment", "serviceaccount", "service"):
        assert exists(kind, r.fullname, *ns), kind
    assert exists("clusterrole", r.fullname) and exists("clusterrolebinding", r.fullname)
    for crd in ("petstrainings.training.pets.dev", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
        assert established(crd), f"CRD {crd} is not Established"
    assert exists("clusterkopfpeerings.kopf.dev", r.peering), "the peering object was not created"

    deployment = get_json("deployment", r.fullname, *ns)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][0] == "run" and f"--peering={r.peering}" in container["args"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    service = get_json("service", r.fullname, *ns)
    assert {p["name"] for p in service["spec"]["ports"]} == {"http-metrics", "http-health"}
    # NOTES.txt tells the next command.
    assert f"rollout status deployment/{r.fullname}" in r.notes
    assert "apply -f petstraining.yaml" in r.notes
    status = json.loads(helm("status", r.name, "--namespace", r.namespace, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"


# What the operator's ServiceAccount must be allowed: (verb, resource, subresource).
NEEDED = [
    *[
        (v, "petstrainings.training.pets.dev", "")
        for v in ("get", "list", "watch", "patch", "update", "delete")
    ],
    *[(v, "petstrainings.training.pets.dev", "status") for v in ("get", "patch", "update")],
    *[(v, "jobs.batch", "") for v in ("create", "get", "list", "watch", "delete", "patch")],
    *[(v, "services", "") for v in ("create", "get", "list", "watch", "delete")],
    *[(v, "pods", "") for v in ("get", "list", "watch", "delete")],
    *[(v, "persistentvolumeclaims", "") for v in ("create", "get")],
    *[(v, "events", "") for v in ("create", "patch", "list")],
    *[(v, "events.events.k8s.io", "") for v in ("create", "patch")],
    *[(v, "pytorchjobs.kubeflow.org", "") for v in ("create", "get", "list", "watch", "delete", "patch")],
]
# What it must not be allowed, anywhere.
DENIED = [
    ("get", "secrets", ""),
    ("list", "secrets", ""),
    ("watch", "secrets", ""),
    ("create", "pods", ""),
    ("deletecollection", "pods", ""),
    ("create", "pods", "exec"),
    ("patch", "services", ""),
    # The output claim goes with its training through the garbage collector, never the operator.
    ("delete", "persistentvolumeclaims", ""),
    ("patch", "persistentvolumeclaims", ""),
    ("get", "pods", "log"),
    ("create", "configmaps", ""),
    ("get", "configmaps", ""),
    ("create", "petstrainings.training.pets.dev", ""),
    ("deletecollection", "petstrainings.training.pets.dev", ""),
    ("update", "jobs.batch", ""),
    ("patch", "jobs.batch", "status"),
    ("create", "deployments.apps", ""),
    ("patch", "deployments.apps", ""),
    ("create", "serviceaccounts", "token"),
    ("create", "roles.rbac.authorization.k8s.io", ""),
    ("create", "rolebindings.rbac.authorization.k8s.io", ""),
]
DENIED_CLUSTER = [
    ("delete", "nodes"),
    ("list", "nodes"),
    ("patch", "nodes"),
    ("get", "storageclasses.storage.k8s.io"),
    ("create", "storageclasses.storage.k8s.io"),
    ("create", "namespaces"),
    ("delete", "namespaces"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io"),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io"),
    ("create", "clusterroles.rbac.authorization.k8s.io"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ("delete", "clusterkopfpeerings.kopf.dev"),
    ("create", "clusterkopfpeerings.kopf.dev"),
    ("impersonate", "serviceaccounts"),
]


def check_grants(
    sa: str, namespaces: list[str | None], expected: bool, rules: list[tuple[str, str, str]]
) -> None:
    """Ask `kubectl auth can-i --as SA` each (verb, resource, subresource) in each namespace."""
    questions = [(ns, verb, resource, sub) for ns in namespaces for verb, resource, sub in rules]
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(lambda q: can_i(sa, q[1], q[2], q[0], q[3]), questions))
    wrong = [
        f"{verb} {resource}{'/' + sub if sub else ''} in {ns or 'all namespaces'}"
        for (ns, verb, resource, sub), answer in zip(questions, answers, strict=True)
        if answer is not expected
    ]
    assert not wrong, f"{sa} {'cannot' if expected else 'can'}: {wrong}"


def test_cluster_mode_rbac_allows_exactly_what_the_operator_needs(
    cluster_release: Release, pytorchjob_crd: None
) -> None:
    sa = cluster_release.sa
    anywhere: list[str | None] = ["default", None]
    check_grants(sa, anywhere, True, NEEDED)
    cluster_scoped = [
        ("list", "namespaces", ""),
        ("watch", "namespaces", ""),
        ("list", "customresourcedefinitions.apiextensions.k8s.io", ""),
        ("watch", "customresourcedefinitions.apiextensions.k8s.io", ""),
        *[(v, "clusterkopfpeerings.kopf.dev", "") for v in ("get", "list", "watch", "patch")],
        ("get", "nodes", ""),
        ("list", "storageclasses.storage.k8s.io", ""),
    ]
    check_grants(sa, [None], True, cluster_scoped)
    check_grants(sa, anywhere, False, DENIED)
    check_grants(sa, [None], False, [(v, r, "") for v, r in DENIED_CLUSTER])


def test_namespaced_mode_grants_only_the_watched_namespaces(
    namespaced_release: tuple[Release, list[str]], pytorchjob_crd: None
) -> None:
    release, watched = namespaced_release
    label = f"app.kubernetes.io/instance={release.name}"
    cluster_objects = kubectl("get", "clusterroles,clusterrolebindings", "-l", label, "-o", "name").stdout
    # Cluster-wide only the ClusterRole (and its binding) that reads Nodes and StorageClasses
    # (rbac.nodes, rbac.storageClasses).
    reads_only = {f"clusterrole.rbac.authorization.k8s.io/{release.fullname}-cluster-reads",
                  f"clusterrolebinding.rbac.authorization.k8s.io/{release.fullname}-cluster-reads"}
    assert set(cluster_objects.split()) == reads_only, f"namespaced mode, cluster-wide: {cluster_objects}"
    for ns in watched:
        assert exists("role", release.fullname, "--namespace", ns)
        assert exists("rolebinding", release.fullname, "--namespace", ns)
        assert exists("kopfpeerings.kopf.dev", release.peering, "--namespace", ns)
    sa = release.sa
    check_grants(sa, list(watched), True, NEEDED)
    check_grants(
        sa, list(watched), True, [(v, "kopfpeerings.kopf.dev", "") for v in ("get", "list", "watch", "patch")]
    )
    check_grants(sa, list(watched), False, DENIED)
    # Nothing outside the watched namespaces, not even in its own namespace, nor cluster-wide.
    outside: list[str | None] = [release.namespace, None]
    check_grants(sa, outside, False, NEEDED)
    check_grants(
        sa,
        [None],
        False,
        [
            ("list", "namespaces", ""),
            ("list", "customresourcedefinitions.apiextensions.k8s.io", ""),
            ("patch", "clusterkopfpeerings.kopf.dev", ""),
            ("list", "nodes", ""),
        ],
    )
    check_grants(sa, [None], True, [("get", "nodes", ""), ("list", "storageclasses.storage.k8s.io", "")])
    check_grants(sa, [None], False, [(v, r, "") for v, r in DENIED_CLUSTER])


def upgrade(release: Release, *settings: str) -> None:
    sets = [a for s in settings for a in ("--set", s)]
    helm("upgrade", release.name, str(CHART), "--namespace", release.namespace, "--reuse-values", *sets,
         "--timeout", "3m")  # fmt: skip


def test_upgrade_keeps_the_release_working(cluster_release: Release) -> None:
    r = cluster_release
    upgrade(r, "metrics.enabled=false")
    try:
        service = get_json("service", r.fullname, "--namespace", r.namespace)
        assert [p["name"] for p in service["spec"]["ports"]] == ["http-health"]
        pod = get_json("deployment", r.fullname, "--namespace", r.namespace)["spec"]["template"]["spec"]
        assert "--metrics-port=0" in pod["containers"][0]["args"]
        assert exists("clusterkopfpeerings.kopf.dev", r.peering), "the upgrade lost the peering object"
    finally:
        upgrade(r, "metrics.enabled=true")


def test_uninstall_removes_what_install_created() -> None:
    with namespaces(f"pets-un-{SUFFIX}") as (ns,):
        release = install(f"pu{SUFFIX}", ns, "peering.enabled=false")
        assert exists("clusterrole", release.fullname)
        uninstall(release)
        assert not exists("clusterrole", release.fullname)
        assert not exists("clusterrolebinding", release.fullname)
        assert not exists(
            "deployment,service,serviceaccount",
            "-l",
            f"app.kubernetes.io/instance={release.name}",
            "--namespace",
            ns,
        )


def test_bad_value_is_refused_by_the_real_install() -> None:
    result = helm(
        "install",
        f"pbad{SUFFIX}",
        str(CHART),
        "--namespace",
        "default",
        "--dry-run=server",
        "--set",
        "image.pullPolicy=Sometimes",
        check=False,
    )
    assert result.returncode != 0 and "pullPolicy" in result.stderr, result.stderr


# ---------------------------------------------------------------- server-side dry-run of helm template


@pytest.mark.parametrize("variant", [None, *CI_VALUES], ids=str)
def test_template_passes_server_side_dry_run(cluster_release: Release, variant: str | None) -> None:
    watched = (
        yaml.safe_load((CHART / variant).read_text()).get("watch", {}).get("namespaces", [])
        if variant
        else []
    )
    with namespaces(*watched):
        args = [
            "template",
            f"pd{SUFFIX}",
            str(CHART),
            "--namespace",
            cluster_release.namespace,
            "--include-crds",
            "--set",
            f"peering.name={cluster_release.peering}",
        ]
        if variant:
            args += ["--values", str(CHART / variant)]
        docs = [d for d in yaml.safe_load_all(helm(*args).stdout) if d]
        ours = [d for d in docs if d["kind"] not in FOREIGN_KINDS]
        foreign = [d for d in docs if d["kind"] in FOREIGN_KINDS]
        assert ours, "nothing rendered"
        result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(ours), check=False)
        assert result.returncode == 0, result.stderr
        for doc in foreign:
            rejected = kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(doc), check=False)
            assert rejected.returncode != 0 and "no matches for kind" in rejected.stderr, rejected.stderr
