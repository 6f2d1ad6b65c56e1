"""The model: any timm model, its classifier trainable, its backbone frozen unless asked; and precision."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import timm
import torch
from torch import nn

from . import hubcache
from .contract import PermanentError
from .hubcache import HubFile

log = logging.getLogger(__name__)


class ModelError(PermanentError):
    """A model name, weights file or precision no restart can fix; the message names the flag and value."""


class HubUnreachableError(ModelError):
    """The hub cannot be reached for pretrained weights (connection refused or unreachable, DNS, timeout,
    offline mode): permanent, since a pod of a cluster without internet never reaches it."""


class ModelDownloadError(RuntimeError):
    """The hub answered but the download failed otherwise (a server error): a restart may help."""


def no_hub_message(name: str, source: HubFile | None, reason: BaseException) -> str:
    """The one line an air-gapped user reads: what failed, and the three ways out."""
    what = f"{source.repo_id}/{source.filename}" if source else "its weights"
    repo = source.repo_id if source else "<repo>"
    return (
        f"pretrained: cannot reach the Hugging Face hub ({hubcache.endpoint()}) for the {name} weights "
        f"({what}): {hubcache.describe(reason)}. spec.pretrained / --pretrained (the default) downloads "
        "them, which a cluster without internet never can; instead mount a hub cache volume filled once "
        f"with `hf download {repo} --cache-dir DIR` (spec.pretrainedCache / --pretrained-cache DIR), or "
        "mount one weights file (spec.weights / --weights FILE), or set spec.pretrained: false "
        "(--no-pretrained) for random init"
    )


def create_model(
    name: str,
    num_classes: int,
    pretrained: bool = False,
    weights: str | None = None,
    pretrained_cache: str | None = None,
) -> nn.Module:
    """A timm model with a fresh ``num_classes`` classifier; pretrained weights come from one source:

    - ``weights``: a local file (safetensors or a torch state dict) loaded the way timm loads hub weights
      (``pretrained_cfg_overlay=dict(file=...)``): a classifier of another size is left out and
      re-initialised;
    - ``pretrained_cache``: a Hugging Face hub cache directory, read with the hub offline;
    - else, with ``pretrained``, the hub. When it cannot be reached, the error (permanent) says so at
      once, after one request without retries, and names the other two sources.
    """
    if not timm.is_model(name):
        raise ModelError(f"model: {name!r} is not a timm model name (see timm.list_models())")
    if weights is not None:
        return _from_file(name, num_classes, weights)
    if pretrained_cache is not None:
        return _from_cache(name, num_classes, pretrained_cache)
    if not pretrained:
        return timm.create_model(name, pretrained=False, num_classes=num_classes)
    return _from_hub(name, num_classes)


def _from_file(name: str, num_classes: int, weights: str) -> nn.Module:
    path = Path(weights)
    if not path.is_file():
        raise ModelError(f"weights: file {weights!r} does not exist")
    log.info("pretrained weights: the file %s", path)
    try:
        return timm.create_model(
            name, pretrained=True, num_classes=num_classes, pretrained_cfg_overlay={"file": str(path)}
        )
    except Exception as err:
        raise ModelError(f"weights: {weights!r} could not be loaded into {name}: {err}") from err


def _from_cache(name: str, num_classes: int, pretrained_cache: str) -> nn.Module:
    cache = Path(pretrained_cache)
    if not cache.is_dir():
        raise ModelError(f"pretrained_cache: directory {pretrained_cache!r} does not exist")
    source = hubcache.hub_file(name)
    log.info("pretrained weights: %s from the hub cache %s (offline)", source or name, cache)
    try:
        with hubcache.offline_hub(cache):
            return timm.create_model(name, pretrained=True, num_classes=num_classes, cache_dir=str(cache))
    except Exception as err:
        if source is None:
            hint = "timm has no hub weights for it: use --weights FILE"
        else:
            hint = (
                f"expected {source.repo_dir(cache)}/snapshots/<commit>/{source.filename} and refs/main; "
                f"fill it once where there is internet with `hf download {source.repo_id} --cache-dir "
                f"{cache}`"
            )
        raise ModelError(
            f"pretrained_cache: {pretrained_cache!r} has no usable {name} weights ({hint}): "
            f"{hubcache.describe(err)}"
        ) from err


def _from_hub(name: str, num_classes: int) -> nn.Module:
    source = hubcache.hub_file(name)
    if source is not None:
        reason = hubcache.unreachable(source, hubcache.hub_timeout())
        if reason is not None:
            if hubcache.cached_file(source) is not None:  # downloaded before into the default cache
                log.info("pretrained weights: the hub is out of reach; %s from the hub cache", source)
                with hubcache.offline_hub():
                    return timm.create_model(name, pretrained=True, num_classes=num_classes)
            raise HubUnreachableError(no_hub_message(name, source, reason))
    log.info("pretrained weights: %s from the hub", source or name)
    try:
        return timm.create_model(name, pretrained=True, num_classes=num_classes)
    except Exception as err:
        reason = hubcache.network_error(err)
        if reason is not None:
            raise HubUnreachableError(no_hub_message(name, source, reason)) from err
        raise ModelDownloadError(
            f"pretrained: downloading {name} weights ({source or 'timm'}) from the hub failed: "
            f"{hubcache.describe(err)}"
        ) from err


def freeze_backbone(model: nn.Module) -> None:
    """The tutorial's freeze: every parameter frozen, then the classifier's made trainable again."""
    for param in model.parameters():
        param.requires_grad = False
    for param in model.get_classifier().parameters():  # type: ignore[operator]
        param.requires_grad = True


class FrozenBackboneClassifier(nn.Module):
    """Runs the frozen backbone under ``torch.no_grad`` and only the classifier with autograd.

    Same computation as ``model(x)`` (train-mode BatchNorm statistics included), but autograd neither
    records the backbone nor keeps its activations, since no gradient can flow into frozen weights.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = self.model.forward_head(self.model.forward_features(x), pre_logits=True)  # type: ignore[operator]
        return self.model.get_classifier()(features)  # type: ignore[operator]


def trainable_module(model: nn.Module, unfreeze: bool) -> nn.Module:
    """The module to train: the whole model, or the frozen-backbone wrapper around it."""
    if unfreeze:
        return model
    freeze_backbone(model)
    if hasattr(model, "forward_head") and hasattr(model, "forward_features"):
        return FrozenBackboneClassifier(model)
    return model


def inner_model(module: nn.Module) -> nn.Module:
    return module.model if isinstance(module, FrozenBackboneClassifier) else module


def adam(params: Iterable[nn.Parameter], lr: float) -> torch.optim.Adam:
    """Adam, fused (torch has it for CPU and CUDA): one kernel for every parameter, its step counts kept
    on the parameters' device, so no step reads a count back, and fp16's GradScaler hands it the inf check
    instead of reading that back from the GPU every step. A checkpoint's own choice (from before) does not
    replace this one."""
    optimizer = torch.optim.Adam(params, lr=lr, fused=True)
    optimizer.register_load_state_dict_pre_hook(_keep_implementation)
    return optimizer


def _keep_implementation(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
    keep = {key: optimizer.param_groups[0][key] for key in ("fused", "foreach")}
    return {**state, "param_groups": [{**group, **keep} for group in state["param_groups"]]}


@dataclass(frozen=True)
class Precision:
    mixed_precision: str  # what Accelerator gets: no, fp16, bf16
    note: str | None  # a log line when the request was changed


CPU_BF16_ENV = "PETS_CPU_BF16"  # 1 or 0: take this answer instead of asking the CPU (tests, benches)


def cpu_runs_bf16_natively() -> bool:
    """Whether this CPU has bf16 instructions (AVX-512 BF16 or AMX). Without them torch emulates bf16
    with fp32 arithmetic and conversions, and a bf16 step took 2.6x an fp32 one (resnet18, 128 px, on
    the 2-core Xeon CI machine). ``PETS_CPU_BF16=1|0`` forces the answer, so both sides run anywhere."""
    forced = os.environ.get(CPU_BF16_ENV)
    if forced is not None:
        if forced not in ("0", "1"):
            raise ModelError(f"{CPU_BF16_ENV} must be 1 (bf16 instructions) or 0 (none), got {forced!r}")
        return forced == "1"
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch.cpu's; private, so looked up
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


GPU_BF16 = (8, 0)  # the compute capability from which a GPU has bf16 tensor cores (Ampere)


def resolve_precision(
    requested: str, on_gpu: bool, cpu_bf16: bool = True, capability: tuple[int, int] | None = None
) -> Precision:
    """What Accelerator gets for ``requested`` on this device (``capability``: the GPU's compute capability).

    auto, the default: on a GPU bf16 where it has bf16 (capability 8.0 or more), since bf16 needs no
    GradScaler, which otherwise reads a flag back from the GPU every step; fp16 on an older GPU (where the
    fused Adam, :func:`adam`, takes the GradScaler's check without a read-back); on a CPU what fp16 becomes.
    fp16 is a GPU mode; on CPU it becomes bf16 where the CPU runs bf16 natively (``cpu_bf16``), else no
    mixed precision, which is then the faster one. An explicit bf16 is kept, with a note when slow."""
    if requested not in ("auto", "no", "fp16", "bf16"):
        raise ModelError(f"mixed_precision must be auto, no, fp16 or bf16, got {requested!r}")
    if requested == "auto":
        return _auto(on_gpu, cpu_bf16, capability)
    if on_gpu or requested == "no":
        return Precision(requested, None)
    if requested == "fp16":
        if cpu_bf16:
            return Precision(
                "bf16", "mixed precision fp16 asked for on CPU: using bf16 instead (fp16 needs a GPU)"
            )
        return Precision(
            "no", "mixed precision fp16 asked for on CPU: using none (fp16 needs a GPU, and this CPU has "
            "no bf16 instructions, AVX-512 BF16 or AMX, so fp32 is faster than bf16 here)"
        )
    if not cpu_bf16:
        return Precision(
            "bf16", "mixed precision bf16 on a CPU without bf16 instructions (AVX-512 BF16 or AMX): torch "
            "emulates it, and mixedPrecision: no trains faster here"
        )
    return Precision(requested, None)


def _auto(on_gpu: bool, cpu_bf16: bool, capability: tuple[int, int] | None) -> Precision:
    if not on_gpu:
        if cpu_bf16:
            return Precision("bf16", "mixed precision auto on CPU: bf16 (this CPU has bf16 instructions)")
        return Precision("no", "mixed precision auto on CPU: none (this CPU has no bf16 instructions, "
                               "AVX-512 BF16 or AMX, so fp32 is faster than bf16 here)")
    if capability is None:
        return Precision("fp16", "mixed precision auto: fp16 (the GPU's compute capability is not known)")
    sm = f"{capability[0]}.{capability[1]}"
    if capability >= GPU_BF16:
        return Precision("bf16", f"mixed precision auto: bf16 (GPU compute capability {sm}; no GradScaler)")
    return Precision("fp16", f"mixed precision auto: fp16 (GPU compute capability {sm}, below 8.0, has no "
                             "bf16 tensor cores; a fused Adam takes the GradScaler's inf check)")
