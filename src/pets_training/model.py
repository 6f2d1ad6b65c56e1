"""The model: any timm model, its classifier trainable, its backbone frozen unless asked; and precision."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import timm
import torch
from torch import nn

from .contract import PermanentError

log = logging.getLogger(__name__)


class ModelError(PermanentError):
    """A model name, weights file or precision no restart can fix; the message names the flag and value."""


class ModelDownloadError(RuntimeError):
    """The hub download of pretrained weights failed: the network may come back, so a restart may help."""


def create_model(
    name: str, num_classes: int, pretrained: bool = False, weights: str | None = None
) -> nn.Module:
    """A timm model with a fresh ``num_classes`` classifier.

    ``weights`` is a local file (safetensors or a torch state dict) loaded the way timm loads hub weights
    (``pretrained_cfg_overlay=dict(file=...)``): a classifier of another size is left out and re-initialised.
    """
    if not timm.is_model(name):
        raise ModelError(f"model: {name!r} is not a timm model name (see timm.list_models())")
    if weights is not None:
        path = Path(weights)
        if not path.is_file():
            raise ModelError(f"weights: file {weights!r} does not exist")
        try:
            return timm.create_model(
                name, pretrained=True, num_classes=num_classes, pretrained_cfg_overlay={"file": str(path)}
            )
        except Exception as err:
            raise ModelError(f"weights: {weights!r} could not be loaded into {name}: {err}") from err
    try:
        return timm.create_model(name, pretrained=pretrained, num_classes=num_classes)
    except Exception as err:
        if pretrained:
            raise ModelDownloadError(
                f"pretrained: downloading {name} weights from the hub failed ({err}); without internet pass "
                "--weights PATH to a local weights file, or drop --pretrained for random init"
            ) from err
        raise


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


@dataclass(frozen=True)
class Precision:
    mixed_precision: str  # what Accelerator gets: no, fp16, bf16
    note: str | None  # a log line when the request was changed


def resolve_precision(requested: str, on_gpu: bool) -> Precision:
    """fp16 is a GPU mode; on CPU it becomes bf16 (with a log line), which CPUs with AVX-512 BF16 run fast."""
    if requested not in ("no", "fp16", "bf16"):
        raise ModelError(f"mixed_precision must be no, fp16 or bf16, got {requested!r}")
    if requested == "fp16" and not on_gpu:
        return Precision(
            "bf16", "mixed precision fp16 asked for on CPU: using bf16 instead (fp16 needs a GPU)"
        )
    return Precision(requested, None)
