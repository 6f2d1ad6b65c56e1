"""Start the operator: credentials, logging, metrics endpoint, peering, namespaces -> kopf."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable, Mapping

import kopf
import yaml
from kubernetes import client, config

from pets_operator import handlers, standby
from pets_operator.context import Context
from pets_operator.settings import Settings

log = logging.getLogger("pets_operator")


class NoClusterError(RuntimeError):
    """No cluster credentials to load; the message says what was looked for and how to fix it."""


def kubeconfig_path(env: Mapping[str, str], kubeconfig: str | None = None) -> str:
    """The kubeconfig to load: the explicit path, else $KUBECONFIG (may list several), else the default."""
    return kubeconfig or env.get("KUBECONFIG") or "~/.kube/config"


def missing_cluster(env: Mapping[str, str], kubeconfig: str | None = None) -> str | None:
    """None when there are credentials to try, else one line saying what was looked for and how to fix it."""
    if kubeconfig is None and env.get("KUBERNETES_SERVICE_HOST"):
        return None
    path = kubeconfig_path(env, kubeconfig)
    if any(os.path.isfile(os.path.expanduser(p)) for p in path.split(os.pathsep) if p):
        return None
    source = "given" if kubeconfig else "from KUBECONFIG" if env.get("KUBECONFIG") else "the default"
    in_cluster = "not used" if kubeconfig else "KUBERNETES_SERVICE_HOST is unset"
    return (
        f"no cluster to connect to: in-cluster config: {in_cluster}; "
        f"kubeconfig: {path} ({source}) not found. "
        "Run the operator in a cluster (its service account is used), or set KUBECONFIG to a kubeconfig file."
    )


def load_client_config(kubeconfig: str | None = None) -> client.Configuration:
    """In-cluster service account credentials, else the kubeconfig (explicit path, $KUBECONFIG, default)."""
    if reason := missing_cluster(os.environ, kubeconfig):
        raise NoClusterError(reason)
    cfg = client.Configuration()
    path = kubeconfig_path(os.environ, kubeconfig)  # resolved here: the client reads $KUBECONFIG on import
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
        else:
            config.load_kube_config(config_file=path, client_configuration=cfg)
    except config.ConfigException as exc:
        raise NoClusterError(f"cannot load cluster credentials: {exc}") from None
    except yaml.YAMLError as exc:
        raise NoClusterError(f"cannot load cluster credentials: {path} is not valid YAML: {exc}") from None
    return cfg


def build(options: Settings, cfg: client.Configuration) -> tuple[kopf.OperatorRegistry, Context]:
    registry = kopf.OperatorRegistry()
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 0, options.workers)
    ctx = Context(api_client=client.ApiClient(cfg), settings=options)
    handlers.register(registry, ctx)
    return registry, ctx


def operator_coroutine(
    options: Settings,
    cfg: client.Configuration,
    *,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> Awaitable[None]:
    """kopf's operator coroutine, configured from `options` (used by `run` and by the tests)."""
    registry, ctx = build(options, cfg)
    own = standby.identity()
    ctx.standby = standby.Standby(ctx.api_client, options.peering_name, options.namespaces, own,
                                  options.priority)
    liveness = f"http://0.0.0.0:{options.liveness_port}/healthz" if options.liveness_port else None
    return kopf.operator(
        registry=registry,
        identity=own,  # type: ignore[arg-type]  # kopf's Identity is a NewType of str, not exported
        standalone=options.peering_name is None,
        peering_name=options.peering_name,
        priority=options.priority,
        clusterwide=not options.namespaces,
        namespaces=list(options.namespaces),
        liveness_endpoint=liveness,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
        memo=kopf.Memo(),
    )


class QuietWatches(logging.Filter):
    """Drop kopf's 'Handler succeeded' line for every watch event: those handlers only wake a worker."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(message.startswith(f"Handler '{watch}' succeeded")
                       for watch in handlers.WATCH_IDS)


def run_operator(options: Settings) -> None:
    """Blocking entry point of `pets-operator run`; raises NoClusterError before anything starts."""
    cfg = load_client_config(options.kubeconfig)
    kopf.configure(
        debug=options.verbose,
        verbose=options.verbose,
        log_format=kopf.LogFormat.JSON if options.log_format == "json" else kopf.LogFormat.PLAIN,
    )
    if not options.verbose:
        for handler in logging.getLogger().handlers:
            handler.addFilter(QuietWatches())
    if options.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(options.metrics_port)
    scope = "all namespaces" if not options.namespaces else ", ".join(options.namespaces)
    peering = (f"peering {options.peering_name!r} with priority {options.priority}" if options.peering_name
               else "standalone")
    log.info(f"pets-operator starting: watching {scope}; {peering}; API {cfg.host}; "
             f"metrics :{options.metrics_port}; health :{options.liveness_port}/healthz")
    asyncio.run(operator_coroutine(options, cfg))  # type: ignore[arg-type]
