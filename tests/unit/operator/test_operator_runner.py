"""The operator's wiring without a cluster: credentials handed to kopf, handlers registered, log filter."""

from __future__ import annotations

import logging

import pytest
from kubernetes import client
from pets_operator import context, handlers, runner
from pets_operator.settings import Settings

pytestmark = pytest.mark.unit


def test_connection_info_carries_the_same_credentials() -> None:
    cfg = client.Configuration()
    cfg.host = "https://api.example:6443"
    cfg.ssl_ca_cert = "/etc/ca.crt"
    cfg.api_key = {"authorization": "Bearer abc.def"}
    info = handlers.connection_info(cfg)
    assert (info.server, info.ca_path, info.scheme, info.token) == (
        "https://api.example:6443", "/etc/ca.crt", "Bearer", "abc.def")
    assert info.insecure is False
    cfg.verify_ssl = False
    cfg.api_key = {}
    cfg.cert_file, cfg.key_file = "/c.crt", "/c.key"
    info = handlers.connection_info(cfg)
    assert info.token is None and info.insecure is True
    assert (info.certificate_path, info.private_key_path) == ("/c.crt", "/c.key")


def test_build_registers_the_handlers() -> None:
    cfg = client.Configuration()
    cfg.host = "https://api.example:6443"
    registry, ctx = runner.build(Settings(progress_port=9999, default_image="img:1"), cfg)
    # No daemon and no change handler: kopf then puts no finalizer on a PetsTraining, and deleting one
    # waits for nobody (the garbage collector takes its children).
    assert not registry._spawning.get_all_handlers()  # noqa: SLF001 - kopf has no public lister
    assert not registry._changing.get_all_handlers()  # noqa: SLF001
    watched = {h.id for h in registry._watching.get_all_handlers()}  # noqa: SLF001
    assert set(handlers.WATCH_IDS) == watched
    indices = {h.id for h in registry._indexing.get_all_handlers()}  # noqa: SLF001
    assert indices == {context.TRAININGS_INDEX, context.JOBS_INDEX, context.PODS_INDEX,
                       context.SERVICES_INDEX}
    assert ctx.settings.progress_port == 9999 and ctx.settings.default_image == "img:1"
    assert cfg.connection_pool_maxsize >= Settings().workers


def test_watch_noise_is_filtered() -> None:
    quiet = runner.QuietWatches()

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, message, None, None)

    assert not quiet.filter(record(f"Handler '{handlers.JOB_WATCH_ID}' succeeded."))
    assert quiet.filter(record("created Job pets"))
