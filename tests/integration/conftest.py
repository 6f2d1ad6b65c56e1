"""Fixtures for the operator's integration tests against a real kube-apiserver (tests/cluster).

Run under tests/cluster/run-with-control-plane.sh (which exports KUBECONFIG and puts helm on PATH),
with KCM_CONTROLLERS='*,-job' so that no job controller fights the test for the Jobs' status.
The operator runs in-process, in a thread, with the chart's ServiceAccount token: the RBAC it gets
is exactly what `helm template charts/pets-training` grants.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from pets_operator import api, runner
from pets_operator.settings import Settings
from polling import wait_for

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "pets-training"
CRD_FILE = CHART / "crds" / f"{api.CRD_NAME}.yaml"
SUFFIX = secrets.token_hex(3)
OPERATOR_NS = f"pets-system-{SUFFIX}"
RELEASE = f"op-{SUFFIX}"  # unique, so the chart's own tests (tests/integration/test_chart.py) never clash
PEERING = f"pets-operator-tests-{SUFFIX}"


def tool(name: str) -> str:
    """helm (from $PETS_CACHE/bin when there) and kubectl; fail loudly when missing."""
    if name == "helm":
        cache = Path(os.environ.get("PETS_CACHE", Path.home() / ".cache" / "pets-training"))
        if (cache / "bin" / "helm").is_file():
            return str(cache / "bin" / "helm")
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} not found: run under tests/cluster/run-with-control-plane.sh", pytrace=False)
    return found


def sh(*args: str, stdin: str | None = None) -> str:
    res = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=300, check=False)
    if res.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}", pytrace=False)
    return res.stdout


@pytest.fixture(scope="session")
def kubeconfig() -> str:
    path = os.environ.get("KUBECONFIG")
    if not path or not Path(path).is_file():
        pytest.fail("KUBECONFIG is not set to a file: run under tests/cluster/run-with-control-plane.sh",
                    pytrace=False)
    return path


@pytest.fixture(scope="session")
def admin(kubeconfig: str) -> client.ApiClient:
    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    return client.ApiClient(cfg)


def wait_established(admin: client.ApiClient, name: str) -> None:
    ext = client.ApiextensionsV1Api(admin)

    def established() -> bool:
        got = ext.read_custom_resource_definition(name)
        return any(c.type == "Established" and c.status == "True"
                   for c in (got.status.conditions if got.status else None) or [])

    wait_for(f"CRD {name} to be Established", established)


@pytest.fixture(scope="session")
def crd(admin: client.ApiClient, kubeconfig: str) -> dict[str, Any]:
    """The chart's PetsTraining CRD, applied server-side and Established."""
    sh(tool("kubectl"), "--kubeconfig", kubeconfig, "apply", "--server-side", "--force-conflicts",
       "-f", str(CRD_FILE))
    wait_established(admin, api.CRD_NAME)
    apply_immutability_policy(admin, kubeconfig)
    return yaml.safe_load(CRD_FILE.read_text())  # type: ignore[no-any-return]


def apply_immutability_policy(admin: client.ApiClient, kubeconfig: str) -> None:
    """The chart's ValidatingAdmissionPolicy (a template, so that a second release can leave it out),
    applied, and waited for: the API server loads a new policy a moment after it is stored. A probe
    training with status.workloadActive shows when an edit of its epochs is refused (not suspended:
    a suspended one takes the edit). No operator runs yet to build its workload."""
    sh(tool("kubectl"), "--kubeconfig", kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", "-",
       stdin=sh(tool("helm"), "template", RELEASE, str(CHART), "--show-only",
                "templates/immutability-policy.yaml"))
    custom = client.CustomObjectsApi(admin)
    probe = f"policy-probe-{SUFFIX}"
    custom.create_namespaced_custom_object(api.GROUP, api.VERSION, "default", api.PLURAL, {
        "apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": api.KIND, "metadata": {"name": probe},
        "spec": {"suspend": False}})
    try:
        custom.patch_namespaced_custom_object_status(api.GROUP, api.VERSION, "default", api.PLURAL, probe,
                                                     {"status": {"workloadActive": True}})

        def refused() -> bool:
            try:
                custom.patch_namespaced_custom_object(api.GROUP, api.VERSION, "default", api.PLURAL, probe,
                                                      {"spec": {"epochs": 3}}, dry_run="All")
            except ApiException as exc:
                return exc.status == 422 and "spec.epochs is immutable" in str(exc.body)
            return False

        wait_for(f"ValidatingAdmissionPolicy {api.IMMUTABILITY_POLICY} to take effect", refused, 60, 0.5)
    finally:
        custom.delete_namespaced_custom_object(api.GROUP, api.VERSION, "default", api.PLURAL, probe)


def chart_objects(*helm_args: str) -> list[dict[str, Any]]:
    out = sh(tool("helm"), "template", RELEASE, str(CHART), "--namespace", OPERATOR_NS, *helm_args)
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="session")
def chart_rbac(admin: client.ApiClient, kubeconfig: str, crd: dict[str, Any]) -> dict[str, Any]:
    """The chart's ServiceAccount, RBAC, peering CRDs and peering object, applied from `helm template`."""
    docs = chart_objects("--set", f"peering.name={PEERING}")
    wanted = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
              "CustomResourceDefinition", "ClusterKopfPeering", "KopfPeering"}
    picked = [d for d in docs if d["kind"] in wanted]
    kinds = {d["kind"] for d in picked}
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"} <= kinds, (
        f"helm template gave no ServiceAccount/ClusterRole/ClusterRoleBinding (got {sorted(kinds)})")
    client.CoreV1Api(admin).create_namespace({"metadata": {"name": OPERATOR_NS}})
    kubectl = tool("kubectl")
    crds = [d for d in picked if d["kind"] == "CustomResourceDefinition"]
    rest = [d for d in picked if d["kind"] != "CustomResourceDefinition"]
    if crds:
        sh(kubectl, "--kubeconfig", kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", "-",
           stdin=yaml.safe_dump_all(crds))
        for c in crds:
            wait_established(admin, c["metadata"]["name"])
    sh(kubectl, "--kubeconfig", kubeconfig, "apply", "--server-side", "-f", "-",
       stdin=yaml.safe_dump_all(rest))
    sa = next(d for d in picked if d["kind"] == "ServiceAccount")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return {"serviceAccount": sa["metadata"]["name"], "namespace": OPERATOR_NS, "args": args,
            "objects": picked}


@pytest.fixture(scope="session")
def operator_config(admin: client.ApiClient, chart_rbac: dict[str, Any]) -> client.Configuration:
    """Credentials of the chart's ServiceAccount (a TokenRequest token), not the admin's."""
    token = client.CoreV1Api(admin).create_namespaced_service_account_token(
        chart_rbac["serviceAccount"], chart_rbac["namespace"],
        {"spec": {"expirationSeconds": 3600 * 3}},
    ).status.token
    base = admin.configuration
    cfg = client.Configuration()
    cfg.host = base.host
    cfg.ssl_ca_cert = base.ssl_ca_cert
    cfg.verify_ssl = base.verify_ssl
    cfg.api_key = {"authorization": f"Bearer {token}"}
    # Prove these credentials are the ServiceAccount's: it may not list secrets cluster-wide.
    try:
        client.CoreV1Api(client.ApiClient(cfg)).list_secret_for_all_namespaces(limit=1)
    except ApiException as exc:
        assert exc.status == 403, exc
    else:
        pytest.fail("the operator's ServiceAccount can list every Secret: the chart's RBAC is too wide")
    return cfg


def _arg(args: list[str], flag: str) -> str | None:
    for a in args:
        if a.startswith(f"{flag}="):
            return a.split("=", 1)[1]
    return None


RUNNING: list[OperatorThread] = []  # operators started in this test process and not stopped


@pytest.fixture()
def operator_paused() -> Iterator[None]:
    """For tests that write a PetsTraining's status by hand: no operator may overwrite it meanwhile."""
    paused = list(RUNNING)
    for op in paused:
        op.stop()
    yield
    for op in paused:
        op.start()


class TrainerMetrics:
    """Rank 0's progress endpoint as the trainer serves it (prometheus_client), on a local port."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        self.registry = CollectorRegistry()
        self.gauges = {name: Gauge(name, name, registry=self.registry) for name in (
            "pets_epoch", "pets_total_epochs", "pets_train_loss", "pets_eval_accuracy",
            "pets_images_per_second", "pets_elapsed_seconds", "pets_eta_seconds", "pets_step",
            "pets_steps_total")}
        self.port = free_port()
        self.server, self.thread = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)

    def set(self, **values: float) -> None:
        for name, value in values.items():
            self.gauges[f"pets_{name}"].set(value)

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(5)


@pytest.fixture(scope="session")
def trainer_metrics() -> Iterator[TrainerMetrics]:
    metrics = TrainerMetrics()
    yield metrics
    metrics.close()


class OperatorThread:
    """The real operator (kopf + our handlers) in a background thread, stoppable and restartable."""

    def __init__(self, cfg: client.Configuration, chart_args: list[str], liveness_port: int = 0,
                 progress_port: int = api.METRICS_PORT):
        peering = None if "--standalone" in chart_args else _arg(chart_args, "--peering")
        self.options = Settings(
            peering_name=peering,
            liveness_port=liveness_port,
            metrics_port=0,
            log_format="plain",
            cluster_domain=_arg(chart_args, "--cluster-domain") or api.DEFAULT_CLUSTER_DOMAIN,
            progress_interval=2.0,
            progress_port=progress_port,
        )
        self.cfg = cfg
        self.thread: threading.Thread | None = None
        self.stop_flag = threading.Event()
        self.ready_flag = threading.Event()
        self.error: BaseException | None = None

    def start(self) -> OperatorThread:
        import asyncio

        RUNNING.append(self)

        self.stop_flag, self.ready_flag = threading.Event(), threading.Event()

        def main() -> None:
            try:
                asyncio.run(runner.operator_coroutine(  # type: ignore[arg-type]
                    self.options, self.cfg, stop_flag=self.stop_flag, ready_flag=self.ready_flag))
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.error = exc

        self.thread = threading.Thread(target=main, name="pets-operator", daemon=True)
        self.thread.start()
        if not self.ready_flag.wait(60):
            pytest.fail(f"operator did not get ready within 60 s (error: {self.error!r})", pytrace=False)
        return self

    def stop(self) -> None:
        if self in RUNNING:
            RUNNING.remove(self)
        self.stop_flag.set()
        if self.thread is not None:
            self.thread.join(60)
            assert not self.thread.is_alive(), "operator thread did not stop within 60 s"
        if self.error is not None:
            raise AssertionError(f"operator crashed: {self.error!r}") from self.error


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def job_controller_off() -> None:
    """The lifecycle tests play the job controller; a real one would overwrite the status they write."""
    controllers = os.environ.get("KCM_CONTROLLERS", "*")
    if "-job" not in controllers.split(","):
        pytest.fail(f"KCM_CONTROLLERS={controllers!r}: the operator's lifecycle tests need the job "
                    "controller off: run them with KCM_CONTROLLERS='*,-job' "
                    "tests/cluster/run-with-control-plane.sh ...", pytrace=False)


@pytest.fixture(scope="session")
def operator(job_controller_off: None, operator_config: client.Configuration,
             chart_rbac: dict[str, Any], trainer_metrics: TrainerMetrics) -> Iterator[OperatorThread]:
    op = OperatorThread(operator_config, chart_rbac["args"], liveness_port=free_port(),
                        progress_port=trainer_metrics.port).start()
    yield op
    op.stop()


@pytest.fixture()
def namespace(admin: client.ApiClient, crd: dict[str, Any]) -> Iterator[str]:
    name = f"pt-{secrets.token_hex(4)}"
    core = client.CoreV1Api(admin)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    # Trainings first, while the operator runs (it releases its finalizer); then the namespace. This
    # also keeps the operator from posting Events into a namespace that is being terminated.
    custom = client.CustomObjectsApi(admin)
    custom.delete_collection_namespaced_custom_object(api.GROUP, api.VERSION, name, api.PLURAL)
    wait_for(f"the PetsTrainings in {name} to be deleted", lambda: not custom.list_namespaced_custom_object(
        api.GROUP, api.VERSION, name, api.PLURAL)["items"])
    core.delete_namespace(name)


@pytest.fixture(scope="session")
def pytorchjob_crd(admin: client.ApiClient, kubeconfig: str) -> str:
    """The real Kubeflow PyTorchJob CRD, from the training-operator Go module (tests/cluster)."""
    path = sh(str(REPO / "tests" / "cluster" / "pytorchjob-crd.sh")).strip()
    sh(tool("kubectl"), "--kubeconfig", kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", path)
    wait_established(admin, "pytorchjobs.kubeflow.org")

    def served() -> bool:
        try:
            found = client.CustomObjectsApi(admin).get_api_resources("kubeflow.org", "v1").resources
        except ApiException as exc:
            if exc.status == 404:  # the group is not in discovery yet
                return False
            raise
        return any(r.name == "pytorchjobs" for r in found)

    wait_for("pytorchjobs in API discovery", served)
    return path


def job_pod(admin: client.ApiClient, ns: str, job: client.V1Job, index: int, status: dict[str, Any],
            node: str | None = None) -> str:
    """One pod of the Job as its controller makes it (labels, owner), with `status` written as a kubelet
    would (no kubelet runs here)."""
    core = client.CoreV1Api(admin)
    name = f"{job.metadata.name}-{index}-{secrets.token_hex(3)}"
    template = client.ApiClient().sanitize_for_serialization(job.spec.template)
    template["metadata"]["labels"] |= {"job-name": job.metadata.name,
                                       "batch.kubernetes.io/job-completion-index": str(index)}
    core.create_namespaced_pod(ns, {
        "metadata": {**template["metadata"], "name": name, "ownerReferences": [{
            "apiVersion": "batch/v1", "kind": "Job", "name": job.metadata.name, "uid": job.metadata.uid,
            "controller": True, "blockOwnerDeletion": True}]},
        "spec": {**template["spec"], **({"nodeName": node} if node else {})}})
    core.patch_namespaced_pod_status(name, ns, {"status": status})
    return name
