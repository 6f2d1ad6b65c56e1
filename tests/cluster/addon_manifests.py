"""Adapt upstream's rendered manifests of an add-on (Kubeflow training-operator, Kueue) to the local node.

Reads a multi-document YAML stream (`kubectl kustomize` output, or Kueue's rendered manifests.yaml) on
stdin and writes it back with only these changes, each checked to have found what it changes (an
upstream layout this does not know fails here, not later in the cluster):

Both controllers also prefer (and tolerate) a dedicated control-plane node where there is one.

kubeflow  the training-operator Deployment: our image, imagePullPolicy Never, args limited to the
          PyTorchJob scheme and its worker init container (image + template file), small requests;
          the webhook Secret filled with certificates made by openssl (addons.sh) and the
          ValidatingWebhookConfiguration given their CA, so the webhook answers from the first start.
kueue     the controller Deployment: our image, imagePullPolicy Never, a lower CPU request, a checksum
          of its Configuration in the pod template; optionally more job frameworks enabled in that
          Configuration (integrations.frameworks); unless --visibility-api, the visibility API's
          APIServices left out (written to --dropped, for deletion) and its feature gate off.
s3        not upstream's: generated here (nothing is read on stdin). The Versity S3 gateway
          (versitygw, POSIX backend) in namespace pets-s3: a Secret with the root credentials, a
          one-replica Deployment storing buckets in an emptyDir, a ClusterIP Service
          http://s3.pets-s3.svc:7070.

usage: addon_manifests.py kubeflow --image IMG --init-image IMG --init-template PATH --webhook-pki DIR
       addon_manifests.py kueue --image IMG [--cpu-request 50m] [--framework kubeflow.org/pytorchjob]...
                                [--visibility-api | --dropped FILE]
       addon_manifests.py s3 --image IMG [--access-key KEY --secret-key KEY]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import sys
from pathlib import Path
from typing import Any

import yaml

Doc = dict[str, Any]

KUBEFLOW_NAMESPACE = "kubeflow"
KUBEFLOW_DEPLOYMENT = "training-operator"
KUBEFLOW_CONTAINER = "training-operator"
KUBEFLOW_SECRET = "training-operator-webhook-cert"
KUBEFLOW_WEBHOOK = "validator.training-operator.kubeflow.org"
# Upstream's Deployment sets no resources at all (BestEffort); these make it accounted for, and small.
KUBEFLOW_REQUESTS = {"cpu": "10m", "memory": "64Mi"}

KUEUE_NAMESPACE = "kueue-system"
KUEUE_DEPLOYMENT = "kueue-controller-manager"
KUEUE_CONTAINER = "manager"
KUEUE_CONFIGMAP = "kueue-manager-config"
KUEUE_CONFIG_KEY = "controller_manager_config.yaml"
CONFIG_CHECKSUM_ANNOTATION = "pets-training.dev/config-sha256"
# Kueue's on-demand visibility API (pending workloads) is an aggregated API. An apiserver without the
# aggregation layer's front-proxy setup (--requestheader-*, --proxy-client-*: the local cluster's) marks
# its APIServices unavailable, and an unavailable APIService stalls every namespace deletion
# (NamespaceDeletionDiscoveryFailure). So by default it is left out and its server switched off.
VISIBILITY_GATE = "VisibilityOnDemand"

# The files of the webhook Secret, as the training-operator's cert rotator (open-policy-agent's
# cert-controller) names them; it keeps a valid set and only injects ca.crt into the webhook.
WEBHOOK_PKI_FILES = ("ca.crt", "ca.key", "tls.crt", "tls.key")


class ManifestError(ValueError):
    """The manifests are not shaped as this script expects (an upstream change)."""


def find(docs: list[Doc], kind: str, name: str, namespace: str | None = None) -> Doc:
    hits = [
        d
        for d in docs
        if d.get("kind") == kind
        and d.get("metadata", {}).get("name") == name
        and (namespace is None or d.get("metadata", {}).get("namespace") == namespace)
    ]
    if len(hits) != 1:
        where = f" in namespace {namespace}" if namespace else ""
        raise ManifestError(f"expected one {kind} {name}{where}, found {len(hits)}")
    return hits[0]


def container(deployment: Doc, name: str) -> Doc:
    containers = deployment["spec"]["template"]["spec"].get("containers", [])
    hits = [c for c in containers if c.get("name") == name]
    if len(hits) != 1:
        names = [c.get("name") for c in containers]
        where = f"Deployment {deployment['metadata']['name']}"
        raise ManifestError(f"{where}: no container {name!r} (has {names})")
    return hits[0]


def set_image(c: Doc, image: str) -> None:
    c["image"] = image
    # The image is imported into the node's containerd, never pulled: fail at once if it is missing.
    c["imagePullPolicy"] = "Never"


CONTROL_PLANE_ROLE = "node-role.kubernetes.io/control-plane"


def prefer_control_plane(deployment: Doc) -> None:
    """Run on the control-plane node where the cluster has a dedicated one (cluster.sh NODES>=2), as
    system controllers do: a worker lost must not take the controller (and its webhooks, which every
    Job or PyTorchJob write goes through) with it for the 300 s of its default toleration."""
    spec = deployment["spec"]["template"]["spec"]
    spec.setdefault("tolerations", []).append(
        {"key": CONTROL_PLANE_ROLE, "operator": "Exists", "effect": "NoSchedule"})
    prefer = {"matchExpressions": [{"key": CONTROL_PLANE_ROLE, "operator": "Exists"}]}
    spec.setdefault("affinity", {}).setdefault("nodeAffinity", {}).setdefault(
        "preferredDuringSchedulingIgnoredDuringExecution", []).append({"weight": 100, "preference": prefer})


def kubeflow(
    docs: list[Doc], image: str, init_image: str, init_template: str, pki: dict[str, bytes]
) -> list[Doc]:
    """training-operator's standalone overlay, adapted (see the module's docstring)."""
    missing = [f for f in WEBHOOK_PKI_FILES if f not in pki]
    if missing:
        raise ManifestError(f"webhook PKI lacks {missing}")
    deployment = find(docs, "Deployment", KUBEFLOW_DEPLOYMENT, KUBEFLOW_NAMESPACE)
    c = container(deployment, KUBEFLOW_CONTAINER)
    set_image(c, image)
    c["args"] = [
        "--enable-scheme=pytorchjob",
        f"--pytorch-init-container-image={init_image}",
        f"--pytorch-init-container-template-file={init_template}",
    ]
    c["resources"] = {"requests": dict(KUBEFLOW_REQUESTS)}
    prefer_control_plane(deployment)
    secret = find(docs, "Secret", KUBEFLOW_SECRET, KUBEFLOW_NAMESPACE)
    secret.pop("stringData", None)
    secret["data"] = {f: base64.b64encode(pki[f]).decode() for f in WEBHOOK_PKI_FILES}
    webhook = find(docs, "ValidatingWebhookConfiguration", KUBEFLOW_WEBHOOK)
    ca_bundle = base64.b64encode(pki["ca.crt"]).decode()
    for hook in webhook.get("webhooks", []):
        hook["clientConfig"]["caBundle"] = ca_bundle
    return docs


def enable_frameworks(config_text: str, frameworks: list[str]) -> str:
    """Add job frameworks to Kueue's Configuration (YAML text) under integrations.frameworks."""
    config = yaml.safe_load(config_text)
    enabled = config.setdefault("integrations", {}).setdefault("frameworks", [])
    added = [f for f in frameworks if f not in enabled]
    if not added:
        return config_text
    enabled.extend(added)
    return str(yaml.safe_dump(config, sort_keys=False))


def without_visibility_api(docs: list[Doc], c: Doc) -> tuple[list[Doc], list[Doc]]:
    """(docs without Kueue's aggregated visibility API, the APIServices dropped); its server is off."""
    dropped = [d for d in docs if d.get("kind") == "APIService"]
    if not dropped:
        raise ManifestError("no APIService (Kueue's visibility API) found")
    args = c.setdefault("args", [])
    gates = [i for i, a in enumerate(args) if a.startswith("--feature-gates=")]
    if gates:
        args[gates[0]] += f",{VISIBILITY_GATE}=false"
    else:
        args.append(f"--feature-gates={VISIBILITY_GATE}=false")
    return [d for d in docs if d.get("kind") != "APIService"], dropped


def kueue(
    docs: list[Doc], image: str, cpu_request: str, frameworks: list[str], visibility_api: bool = False
) -> tuple[list[Doc], list[Doc]]:
    """Kueue's config/default rendering, adapted (see the module's docstring): (docs, docs dropped)."""
    deployment = find(docs, "Deployment", KUEUE_DEPLOYMENT, KUEUE_NAMESPACE)
    c = container(deployment, KUEUE_CONTAINER)
    set_image(c, image)
    dropped: list[Doc] = []
    if not visibility_api:
        docs, dropped = without_visibility_api(docs, c)
    requests = c.setdefault("resources", {}).setdefault("requests", {})
    requests["cpu"] = cpu_request
    prefer_control_plane(deployment)
    cm = find(docs, "ConfigMap", KUEUE_CONFIGMAP, KUEUE_NAMESPACE)
    if KUEUE_CONFIG_KEY not in cm.get("data", {}):
        raise ManifestError(f"ConfigMap {KUEUE_CONFIGMAP} has no {KUEUE_CONFIG_KEY}")
    if frameworks:
        cm["data"][KUEUE_CONFIG_KEY] = enable_frameworks(cm["data"][KUEUE_CONFIG_KEY], frameworks)
    # The config is mounted with subPath, which a running pod never sees change: a checksum in the pod
    # template rolls the Deployment when it does (a re-run `up` with other frameworks).
    checksum = hashlib.sha256(cm["data"][KUEUE_CONFIG_KEY].encode()).hexdigest()[:16]
    template_meta = deployment["spec"]["template"].setdefault("metadata", {})
    template_meta.setdefault("annotations", {})[CONFIG_CHECKSUM_ANNOTATION] = checksum
    return docs, dropped


def frameworks_of(docs: list[Doc]) -> list[str]:
    """Kueue's enabled integrations.frameworks, as its Configuration lists them."""
    cm = find(docs, "ConfigMap", KUEUE_CONFIGMAP, KUEUE_NAMESPACE)
    config = yaml.safe_load(cm["data"][KUEUE_CONFIG_KEY])
    return list(config.get("integrations", {}).get("frameworks", []))


# ------------------------------------------------------------------ S3 (Versity S3 gateway)
S3_NAMESPACE = "pets-s3"
S3_NAME = "s3"  # the Deployment, its container and the Service: http://s3.pets-s3.svc:7070
S3_SECRET = "s3-credentials"
S3_PORT = 7070
S3_REGION = "us-east-1"  # versitygw's default; SigV4 clients must sign for it
S3_ENDPOINT = f"http://{S3_NAME}.{S3_NAMESPACE}.svc:{S3_PORT}"
S3_LABELS = {"app.kubernetes.io/name": S3_NAME, "app.kubernetes.io/part-of": "pets-training-tests"}
# Fixed root credentials, on purpose: this S3 server lives only inside a throwaway local test cluster,
# holds test data, and is reachable only from that cluster (or through a port-forward); fixed values
# let a test or a person use it without reading the Secret first. Not for anything real.
S3_ACCESS_KEY = "pets-s3-root"
S3_SECRET_KEY = "pets-s3-root-secret-for-tests-only"
S3_DATA_DIR = "/data"  # the buckets: /data/BUCKET/KEY
# The objects' metadata (ETag, checksums, ACLs) in plain files here instead of user.* xattrs on
# /data: no dependence on the node filesystem's xattr support (an emptyDir on tmpfs before Linux
# 6.6, some overlay setups).
S3_META_DIR = "/meta"
S3_USER = 65532  # the image's user (addons-build.sh), like the controllers' images
S3_REQUESTS = {"cpu": "10m", "memory": "32Mi"}
S3_LIMITS = {"memory": "512Mi"}


def cluster_service(name: str, meta: Doc, port_name: str, port: int) -> Doc:
    """The ClusterIP Service of an add-on's one Deployment (pods labelled app.kubernetes.io/name=NAME)."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, **meta}, "spec": {
        "type": "ClusterIP", "selector": {"app.kubernetes.io/name": name},
        "ports": [{"name": port_name, "port": port, "targetPort": port_name, "protocol": "TCP"}]}}


def restricted_security_context() -> tuple[Doc, Doc]:
    """(pod, container) securityContext meeting Pod Security `restricted` (the namespace enforces it)."""
    pod = {
        "runAsNonRoot": True,
        "runAsUser": S3_USER,
        "runAsGroup": S3_USER,
        "fsGroup": S3_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    ctr = {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    return pod, ctr


def s3(image: str, access_key: str = S3_ACCESS_KEY, secret_key: str = S3_SECRET_KEY) -> list[Doc]:
    """The S3 add-on's objects: Namespace, credentials Secret, Deployment, Service."""
    if not access_key or not secret_key:
        raise ManifestError("the S3 root access key and secret key must not be empty")
    meta = {"namespace": S3_NAMESPACE, "labels": dict(S3_LABELS)}
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": S3_NAMESPACE,
            "labels": {
                **S3_LABELS,
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/warn": "restricted",
            },
        },
    }
    # Keys named as the AWS SDKs read them from the environment, so a pod can `envFrom` a copy of
    # this Secret (AWS_ENDPOINT_URL: boto3 >= 1.28, the AWS CLI v2).
    creds = {
        "AWS_ACCESS_KEY_ID": access_key,
        "AWS_SECRET_ACCESS_KEY": secret_key,
        "AWS_ENDPOINT_URL": S3_ENDPOINT,
        "AWS_REGION": S3_REGION,
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": S3_SECRET, **meta},
        "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in creds.items()},
    }
    pod_sc, ctr_sc = restricted_security_context()

    def from_secret(env: str, key: str) -> Doc:
        return {"name": env, "valueFrom": {"secretKeyRef": {"name": S3_SECRET, "key": key}}}

    ctr = {
        "name": S3_NAME,
        "image": image,
        "imagePullPolicy": "Never",
        # versitygw reads the root user from ROOT_ACCESS_KEY / ROOT_SECRET_KEY (its --access/--secret).
        "env": [
            from_secret("ROOT_ACCESS_KEY", "AWS_ACCESS_KEY_ID"),
            from_secret("ROOT_SECRET_KEY", "AWS_SECRET_ACCESS_KEY"),
        ],
        "args": [
            f"--port=:{S3_PORT}",
            f"--region={S3_REGION}",
            "--health=/health",  # GET /health answers 200 without credentials: the readiness probe
            "posix",
            f"--sidecar={S3_META_DIR}",
            S3_DATA_DIR,
        ],
        "ports": [{"name": "s3", "containerPort": S3_PORT, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": "s3"},
            "periodSeconds": 2,
            "failureThreshold": 3,
        },
        "livenessProbe": {"tcpSocket": {"port": "s3"}, "periodSeconds": 10, "failureThreshold": 6},
        "resources": {"requests": dict(S3_REQUESTS), "limits": dict(S3_LIMITS)},
        "securityContext": ctr_sc,
        "volumeMounts": [
            {"name": "data", "mountPath": S3_DATA_DIR},
            {"name": "meta", "mountPath": S3_META_DIR},
        ],
    }
    # Another Secret rolls the pod (the env is read at start only); the data goes with it: an emptyDir.
    checksum = hashlib.sha256(f"{access_key}\0{secret_key}".encode()).hexdigest()[:16]
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": S3_NAME, **meta},
        "spec": {
            "replicas": 1,
            # one writer of the emptyDir at a time, and no old pod answering beside the new one
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": S3_NAME}},
            "template": {
                "metadata": {
                    "labels": dict(S3_LABELS),
                    "annotations": {CONFIG_CHECKSUM_ANNOTATION: checksum},
                },
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": pod_sc,
                    "containers": [ctr],
                    "volumes": [{"name": "data", "emptyDir": {}}, {"name": "meta", "emptyDir": {}}],
                },
            },
        },
    }
    return [namespace, secret, deployment, cluster_service(S3_NAME, meta, "s3", S3_PORT)]


# libyaml's C loader and dumper where PyYAML has them (Kueue's manifests are 26,000 lines).
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def load(text: str) -> list[Doc]:
    return [d for d in yaml.load_all(text, Loader=_Loader) if d]


def dump(docs: list[Doc]) -> str:
    return str(yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="addon", required=True)
    kf = sub.add_parser("kubeflow", help="Kubeflow training-operator (manifests/overlays/standalone)")
    kf.add_argument("--image", required=True)
    kf.add_argument("--init-image", required=True, help="image of the PyTorchJob workers' init container")
    kf.add_argument("--init-template", required=True, help="its template file, inside --init-image")
    kf.add_argument(
        "--webhook-pki", type=Path, required=True, help="directory with " + ", ".join(WEBHOOK_PKI_FILES)
    )
    kq = sub.add_parser("kueue", help="Kueue (config/default)")
    kq.add_argument("--image", required=True)
    kq.add_argument("--cpu-request", default="50m")
    kq.add_argument(
        "--framework", action="append", default=[], help="enable this integration too (repeatable)"
    )
    kq.add_argument("--visibility-api", action="store_true", help="keep the aggregated visibility API")
    kq.add_argument("--dropped", type=Path, help="write the objects left out here (YAML)")
    kq.add_argument("--print-frameworks", action="store_true", help="only list the enabled frameworks")
    s3p = sub.add_parser("s3", help="the Versity S3 gateway (generated, no input)")
    s3p.add_argument("--image", required=True)
    s3p.add_argument("--access-key", default=S3_ACCESS_KEY, help="root access key (a fixed test value)")
    s3p.add_argument("--secret-key", default=S3_SECRET_KEY, help="root secret key (a fixed test value)")
    args = ap.parse_args(argv)
    try:
        if args.addon == "s3":
            docs = s3(args.image, args.access_key, args.secret_key)
            sys.stdout.write(dump(docs))
            return 0
        docs = load(sys.stdin.read())
        if args.addon == "kubeflow":
            pki = {f: (args.webhook_pki / f).read_bytes() for f in WEBHOOK_PKI_FILES}
            docs = kubeflow(docs, args.image, args.init_image, args.init_template, pki)
        elif args.print_frameworks:
            print("\n".join(frameworks_of(docs)))
            return 0
        else:
            docs, dropped = kueue(docs, args.image, args.cpu_request, args.framework, args.visibility_api)
            if args.dropped:
                args.dropped.write_text(dump(dropped))
    except (ManifestError, OSError) as exc:
        print(f"addon_manifests.py {args.addon}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(dump(docs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
