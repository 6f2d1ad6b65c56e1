"""`pets-operator`: run the operator, or render what it would create for a PetsTraining.

    pets-operator run [--namespace NS ...] [--liveness-port 8080] [--metrics-port 8000]
                      [--peering NAME | --standalone] [--priority N|auto] [--log-format json|plain]
    pets-operator render -f petstraining.yaml [--backend NAME]  # a name of backends.BACKENDS
    pets-operator crd            # print the CustomResourceDefinition (the chart's crds/ file)

`render` needs no cluster: it applies the CRD's defaults and validation locally and prints the
children the operator would create (the backend's workload, and its Service where it uses one),
as a YAML stream.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pets_contract import __version__
from pets_operator import api, backends, builders
from pets_operator.settings import Settings

DEFAULTS = Settings()  # the flags' defaults are the settings' own


def _positive_port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port must be an integer, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be within 0..65535 (0 disables it), got {port}")
    return port


# A replica with priority "auto" draws one from this range: kopf pauses every replica when two share
# a priority, so the replicas of one Deployment must not; a collision is about one in a billion.
AUTO_PRIORITY_RANGE = (1, 1_000_000_000)


def _at_least_one(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text!r}")
        return value
    return parse


PEER_KEYS = {"podSelector", "namespaceSelector", "ipBlock"}  # networking.k8s.io/v1 NetworkPolicyPeer


def _peers(text: str) -> tuple[dict[str, object], ...]:
    """`--metrics-from`: a JSON list of NetworkPolicyPeers (podSelector, namespaceSelector, ipBlock)."""
    try:
        peers = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"must be a JSON list of NetworkPolicyPeers, got {text!r}: {exc}") \
            from None
    if not isinstance(peers, list):
        raise argparse.ArgumentTypeError(f"must be a JSON list of NetworkPolicyPeers, got {text!r}")
    for i, peer in enumerate(peers):
        if not isinstance(peer, dict) or not peer or set(peer) - PEER_KEYS:
            raise argparse.ArgumentTypeError(
                f"item {i} must be a NetworkPolicyPeer (keys {', '.join(sorted(PEER_KEYS))}), got {peer!r}")
    return tuple(peers)


def _priority(text: str) -> int:
    """`--priority`: an integer, or `auto` for a random one (replicas of one Deployment)."""
    if text == "auto":
        return random.SystemRandom().randint(*AUTO_PRIORITY_RANGE)
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"priority must be an integer or 'auto', got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pets-operator",
        description="Kubernetes operator for PetsTraining (training.pets.dev/v1alpha1).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    _add_run(sub)
    _add_render(sub)
    sub.add_parser("crd", help="print the PetsTraining CustomResourceDefinition as YAML")
    sub.add_parser("policy", help="print the ValidatingAdmissionPolicy (and binding) that keeps a running "
                                  "training's workload fields immutable, as YAML")
    return parser


def _add_run(sub: Any) -> None:
    """`pets-operator run`: where it watches and serves, peering, logging, and what a training gets by
    default."""
    run = sub.add_parser(
        "run",
        help="run the operator against the cluster of the current kubeconfig or service account",
        description="Run the operator. Watches every namespace unless --namespace is given.",
    )
    run.add_argument(
        "--namespace", "-n", action="append", default=[], metavar="NS",
        help="namespace to watch; repeat for several; none means all namespaces (cluster-wide)",
    )
    run.add_argument(
        "--liveness-port", type=_positive_port, default=DEFAULTS.liveness_port, metavar="PORT",
        help=f"port of the health endpoint http://0.0.0.0:PORT/healthz, used for liveness and "
        f"readiness probes; 0 disables it (default {DEFAULTS.liveness_port})",
    )
    run.add_argument(
        "--metrics-port", type=_positive_port, default=DEFAULTS.metrics_port, metavar="PORT",
        help=f"port of the Prometheus endpoint http://0.0.0.0:PORT/metrics; 0 disables it "
        f"(default {DEFAULTS.metrics_port})",
    )
    peering = run.add_mutually_exclusive_group()
    peering.add_argument(
        "--peering", default=DEFAULTS.peering_name, metavar="NAME",
        help=f"kopf peering object name; replicas sharing it elect one active operator "
        f"(default {DEFAULTS.peering_name!r}; needs the KopfPeering/ClusterKopfPeering CRDs)",
    )
    peering.add_argument(
        "--standalone", action="store_true",
        help="do not use peering (a single replica, or tests)",
    )
    run.add_argument(
        "--priority", type=_priority, default=0, metavar="N|auto",
        help="peering priority of this replica; the highest live one acts, the others stand by. "
        "'auto' draws a random one, so replicas of one Deployment never tie (a tie pauses them all) "
        "(default 0)",
    )
    run.add_argument(
        "--log-format", choices=["json", "plain"], default="json",
        help="structured JSON log lines (default) or plain text",
    )
    run.add_argument("--verbose", action="store_true", help="log at DEBUG level")
    run.add_argument(
        "--default-image", default=api.DEFAULT_IMAGE, metavar="IMAGE",
        help=f"trainer image for PetsTrainings that do not set spec.image (default {api.DEFAULT_IMAGE})",
    )
    run.add_argument(
        "--cluster-domain", default=api.DEFAULT_CLUSTER_DOMAIN, metavar="DOMAIN",
        help=f"cluster DNS domain used in the main process address (default {api.DEFAULT_CLUSTER_DOMAIN})",
    )
    _add_run_defaults(run)


def _add_run_defaults(run: argparse.ArgumentParser) -> None:
    """`run`'s flags for what trainings get where their spec says nothing, and its pace."""
    run.add_argument(
        "--auto-backend", choices=list(backends.BACKENDS), default=backends.DEFAULT_AUTO,
        help=f"what spec.backend 'auto' runs as where that backend's API is served (else job) "
             f"(default {backends.DEFAULT_AUTO})",
    )
    run.add_argument(
        "--default-output", choices=["managedClaim", "emptyDir"], default="managedClaim",
        help="output of a PetsTraining without spec.output: a claim the operator makes (falls back to "
             "an emptyDir, and says so, where the cluster has no default StorageClass), or an emptyDir, "
             "which loses the work on any restart (default managedClaim)",
    )
    run.add_argument(
        "--default-output-claim-size", default=api.DEFAULT_OUTPUT_CLAIM_SIZE, metavar="QUANTITY",
        help=f"size of that claim (default {api.DEFAULT_OUTPUT_CLAIM_SIZE})",
    )
    run.add_argument(
        "--default-output-storage-class", default="", metavar="NAME",
        help="StorageClass of that claim (default: the cluster's default StorageClass)",
    )
    run.add_argument(
        "--training-network-policy", choices=["on", "off"], default="on",
        help="a NetworkPolicy per training: its pods accept connections only from the pods of the same "
             "training and, on the progress port, from --metrics-from; off: none, whatever "
             "spec.networkPolicy says (default on)",
    )
    run.add_argument(
        "--metrics-from", type=_peers, default=(), metavar="JSON",
        help="the NetworkPolicyPeers (a JSON list) that may read the trainers' progress port; the chart "
             "names the operator's pods and trainingNetworkPolicy.metricsFrom (default: none, so that port "
             "is open to every source)",
    )
    for flag, kind, default, meaning in (
            ("--workers", int, api.DEFAULT_WORKERS,
             "PetsTrainings reconciled at once, each in a thread that waits on the API server"),
            ("--progress-interval", float, api.DEFAULT_PROGRESS_INTERVAL,
             "seconds between two reads of every running training's progress"),
            ("--scrape-concurrency", int, api.DEFAULT_SCRAPE_CONCURRENCY, "progress reads in flight at once"),
            ("--scrape-timeout", float, api.DEFAULT_SCRAPE_TIMEOUT, "seconds one progress read may take")):
        run.add_argument(flag, type=_at_least_one(kind), default=default,
                         metavar="N" if kind is int else "SECONDS", help=f"{meaning} (default {default:g})")


def _add_render(sub: Any) -> None:
    render = sub.add_parser(
        "render",
        help="print the manifests the operator would create for a PetsTraining (no cluster)",
    )
    render.add_argument("-f", "--filename", required=True, help="PetsTraining YAML file, or - for stdin")
    render.add_argument(
        "--backend", choices=list(backends.BACKENDS), default=None,
        help="resolve backend 'auto' to this (default: job, as on a cluster that serves no other "
             "backend's CRD)",
    )
    render.add_argument("--namespace", default=None,
                        help="namespace when the file sets none (default: default)")
    render.add_argument("--default-image", default=api.DEFAULT_IMAGE, metavar="IMAGE")
    render.add_argument("--cluster-domain", default=api.DEFAULT_CLUSTER_DOMAIN, metavar="DOMAIN")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("crd", "policy"):
        from pets_operator import crd

        sys.stdout.write(crd.crd_yaml() if args.command == "crd" else crd.policy_yaml())
        return 0
    if args.command == "render":
        from pets_operator.render import render_file

        try:
            sys.stdout.write(render_file(args.filename, backend=args.backend, namespace=args.namespace,
                                         default_image=args.default_image,
                                         cluster_domain=args.cluster_domain))
        except (api.SpecError, OSError, ValueError) as exc:
            print(f"pets-operator render: {exc}", file=sys.stderr)
            return 2
        return 0
    from pets_operator.runner import NoClusterError, run_operator

    try:
        default_output = api.default_output(args.default_output, args.default_output_claim_size,
                                            args.default_output_storage_class)
    except ValueError as exc:
        print(f"pets-operator run: {exc}", file=sys.stderr)
        return 2
    try:
        # A flag named like a setting is that setting; the others are made from their flags here.
        same = {f.name: getattr(args, f.name) for f in dataclasses.fields(Settings) if hasattr(args, f.name)}
        run_operator(Settings(**same | {
            "namespaces": tuple(args.namespace), "peering_name": None if args.standalone else args.peering,
            "default_output": default_output, "network_policy": builders.NetworkPolicySettings(
                args.training_network_policy == "on", args.metrics_from)}))
    except NoClusterError as exc:
        print(f"pets-operator run: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
