"""Pretrained weights from the Hugging Face hub, the way the ecosystem keeps them.

timm loads ``timm.create_model("resnet50d", pretrained=True)`` from the hub repo in the model's
``pretrained_cfg.hf_hub_id`` (``timm/resnet50d.ra2_in1k``), file ``model.safetensors``, through
``huggingface_hub.hf_hub_download``, which keeps it in the hub cache (``$HF_HUB_CACHE``)::

    <cache>/models--timm--resnet50d.ra2_in1k/
        blobs/<sha256 of the file>
        refs/main                                  # the commit hash, no newline
        snapshots/<commit>/model.safetensors       # -> ../../blobs/<sha256> (a relative symlink)

A directory in that layout (filled once with ``hf download timm/resnet50d.ra2_in1k --cache-dir DIR``, or
by timm's own download) is what ``--pretrained-cache DIR`` reads, with the hub in offline mode
(:func:`offline_hub`). :func:`make_hub_cache` writes one from a random-init model, for tests.

Nothing here imports ``huggingface_hub``, timm or torch at module level: :func:`set_hub_timeout_defaults`
must run before ``huggingface_hub`` reads its environment at import.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# huggingface_hub reads these at import (seconds); we default them to 10 s where the user has not set them.
HUB_TIMEOUT_ENV = ("HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT")
DEFAULT_HUB_TIMEOUT = 10
HUB_CACHE_ENV = "HF_HUB_CACHE"
HUB_OFFLINE_ENV = "HF_HUB_OFFLINE"
DEFAULT_FILENAME = "model.safetensors"  # timm asks for this first (the safe alternative of pytorch_model.bin)


def set_hub_timeout_defaults(env: MutableMapping[str, str] = os.environ) -> None:
    """Short hub timeouts (10 s) unless the user set their own; call before importing ``huggingface_hub``."""
    for name in HUB_TIMEOUT_ENV:
        if not env.get(name, "").strip():
            env[name] = str(DEFAULT_HUB_TIMEOUT)


def hub_timeout(env: MutableMapping[str, str] = os.environ) -> float:
    try:
        return float(env.get("HF_HUB_ETAG_TIMEOUT", "").strip() or DEFAULT_HUB_TIMEOUT)
    except ValueError:
        return float(DEFAULT_HUB_TIMEOUT)


@dataclass(frozen=True)
class HubFile:
    """Where timm finds a model's pretrained weights on the hub."""

    repo_id: str  # timm/resnet50d.ra2_in1k
    filename: str  # model.safetensors
    revision: str | None = None  # None: main

    def __str__(self) -> str:
        return f"{self.repo_id}/{self.filename}"

    def repo_dir(self, cache_dir: Path) -> Path:
        return Path(cache_dir) / ("models--" + self.repo_id.replace("/", "--"))


def hub_file(model_name: str) -> HubFile | None:
    """The hub repo and file timm loads for ``model_name`` (a tag such as ``resnet50d.ra2_in1k`` included);
    None when timm has no hub weights for it (no pretrained config, or a URL-only one)."""
    from timm.models import get_pretrained_cfg

    try:
        cfg = get_pretrained_cfg(model_name)
    except Exception:
        return None
    if cfg is None or not cfg.hf_hub_id:
        return None
    repo_id, _, revision = cfg.hf_hub_id.partition("@")
    return HubFile(repo_id, cfg.hf_hub_filename or DEFAULT_FILENAME, revision or None)


def make_hub_cache(cache_dir: str | Path, model_name: str, seed: int = 0) -> Path:
    """Write ``model_name``'s weights (random init, seeded) into ``cache_dir`` in the hub cache layout, as
    ``hf download`` would; returns the snapshot file. For tests: ``--pretrained-cache cache_dir`` loads
    exactly these tensors."""
    import timm
    import torch
    from safetensors.torch import save_file

    source = hub_file(model_name)
    if source is None:
        raise ValueError(f"timm has no hub weights for {model_name!r}")
    torch.manual_seed(seed)
    model = timm.create_model(model_name, pretrained=False)
    repo = source.repo_dir(Path(cache_dir))
    blobs = repo / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    tmp = blobs / ".incoming.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp))
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    blob = blobs / digest
    tmp.replace(blob)
    # safetensors writes 0600; the hub's own download applies the umask (0644 here), and a cache on a
    # volume is read by the trainer's uid 65532, not by whoever filled it
    umask = os.umask(0)
    os.umask(umask)
    blob.chmod(0o666 & ~umask)
    commit = hashlib.sha1(f"{source.repo_id}:{digest}".encode()).hexdigest()  # any 40 hex digits
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / (source.revision or "main")).write_text(commit)
    snapshot = repo / "snapshots" / commit / source.filename
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    snapshot.unlink(missing_ok=True)  # a link there before, dangling or not
    snapshot.symlink_to(os.path.relpath(blob, snapshot.parent))
    return snapshot


def cached_file(source: HubFile, cache_dir: str | Path | None = None) -> str | None:
    """The file in the hub cache (``cache_dir``, else the default one), or None when it is not there."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(
        source.repo_id, source.filename, cache_dir=cache_dir, revision=source.revision
    )
    return found if isinstance(found, str) else None


@contextmanager
def offline_hub(cache_dir: str | Path | None = None) -> Iterator[None]:
    """``HF_HUB_OFFLINE=1`` (and ``HF_HUB_CACHE=cache_dir``) for the block: in the environment and in the
    already imported ``huggingface_hub.constants``, which read the environment only at import."""
    from huggingface_hub import constants

    saved_env = {name: os.environ.get(name) for name in (HUB_OFFLINE_ENV, HUB_CACHE_ENV)}
    saved = (constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE)
    os.environ[HUB_OFFLINE_ENV] = "1"
    constants.HF_HUB_OFFLINE = True
    if cache_dir is not None:
        os.environ[HUB_CACHE_ENV] = str(cache_dir)
        constants.HF_HUB_CACHE = str(cache_dir)
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE = saved
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_NETWORK_ERRORS = {
    # httpx (huggingface_hub 1.x) and httpx2 (2.x) transport errors, huggingface_hub's offline mode, and
    # the standard library's
    "TransportError", "ConnectError", "TimeoutException", "ProxyError", "NetworkError",
    "OfflineModeIsEnabled", "URLError", "gaierror", "ConnectionError", "TimeoutError",
}  # fmt: skip
# the server answered (urllib's HTTPError is a URLError)
_HTTP_ANSWERS = {"HTTPError", "HTTPStatusError", "HfHubHTTPError"}


def network_error(err: BaseException) -> BaseException | None:
    """The network failure behind ``err`` (connection refused or unreachable, DNS, timeout, proxy, offline
    mode), searching its cause and context chain; None when it is something else."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        names = {klass.__name__ for klass in type(current).__mro__}
        if names & _NETWORK_ERRORS and not names & _HTTP_ANSWERS:
            return current
        current = current.__cause__ or current.__context__
    return None


def describe(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())


def unreachable(source: HubFile, timeout: float) -> BaseException | None:
    """One HEAD request for ``source`` (no retries): the network error when the hub cannot be reached, None
    when it answered (any HTTP status: what it said is then timm's download's business)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(source.repo_id, source.filename, revision=source.revision)
    try:
        get_hf_file_metadata(url, timeout=timeout)
    except Exception as err:
        return network_error(err)
    return None


def endpoint() -> str:
    from huggingface_hub import constants

    return str(constants.ENDPOINT)
