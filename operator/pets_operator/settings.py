"""The operator's settings: every flag of `pets-operator run` (the chart's `operator.*` values), made
once by the CLI (or a test) and read by the runner and the handlers through `Context.settings`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pets_operator import api, backends, builders


@dataclass(frozen=True)
class Settings:
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    liveness_port: int = 8080
    metrics_port: int = 8000
    peering_name: str | None = "pets-training"  # None: standalone
    priority: int = 0
    log_format: str = "json"
    verbose: bool = False
    kubeconfig: str | None = None  # None: in-cluster, else $KUBECONFIG / ~/.kube/config
    default_image: str = api.DEFAULT_IMAGE
    cluster_domain: str = api.DEFAULT_CLUSTER_DOMAIN
    auto_backend: str = backends.DEFAULT_AUTO  # what spec.backend `auto` runs as (where it is served)
    default_output: dict[str, Any] = field(default_factory=api.default_output)  # where spec.output is unset
    network_policy: builders.NetworkPolicySettings = field(default_factory=builders.NetworkPolicySettings)
    # Seconds between two reads of a running training's progress; also how often a training whose state
    # is not watched is looked at again.
    progress_interval: float = api.DEFAULT_PROGRESS_INTERVAL
    progress_port: int = api.METRICS_PORT  # the trainer's contract port; tests point it elsewhere
    workers: int = api.DEFAULT_WORKERS  # concurrent reconciliations (each mostly waits on the API server)
    scrape_concurrency: int = api.DEFAULT_SCRAPE_CONCURRENCY  # progress reads in flight at once
    scrape_timeout: float = api.DEFAULT_SCRAPE_TIMEOUT  # seconds for one progress read
