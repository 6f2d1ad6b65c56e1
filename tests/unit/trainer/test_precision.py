"""The default precision (auto) by device, and the fused Adam that keeps fp16's GradScaler from reading back.

``resolve_precision`` is pure: the GPU's compute capability and the CPU's bf16 instructions are arguments,
so every device's side runs here. fp16 autocast and accelerate's GradScaler need a GPU; the scaler's step
itself runs on a CPU (``torch.amp.GradScaler("cpu")``), which is where the read-back is decided.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from accelerate.optimizer import patch_optimizer_step
from torch.utils._python_dispatch import TorchDispatchMode

from pets_training.config import resolve
from pets_training.model import ModelError, adam, resolve_precision

pytestmark = pytest.mark.unit

SM70, SM80, SM90 = (7, 0), (8, 0), (9, 0)  # V100, A100, H100/H200


@pytest.mark.parametrize(("capability", "picked"), [(SM70, "fp16"), ((7, 5), "fp16"), (SM80, "bf16"),
                                                    ((8, 6), "bf16"), (SM90, "bf16")])
def test_auto_on_a_gpu_picks_bf16_from_compute_capability_8_and_fp16_below(
    capability: tuple[int, int], picked: str
) -> None:
    precision = resolve_precision("auto", on_gpu=True, capability=capability)
    assert precision.mixed_precision == picked
    assert precision.note and f"compute capability {capability[0]}.{capability[1]}" in precision.note
    assert precision == resolve_precision("auto", on_gpu=True, cpu_bf16=False, capability=capability)


@pytest.mark.parametrize(("cpu_bf16", "picked"), [(True, "bf16"), (False, "no")])
def test_auto_on_a_cpu_is_what_fp16_becomes_there(cpu_bf16: bool, picked: str) -> None:
    precision = resolve_precision("auto", on_gpu=False, cpu_bf16=cpu_bf16)
    assert precision.mixed_precision == picked == resolve_precision("fp16", False, cpu_bf16).mixed_precision
    assert precision.note and precision.note.startswith("mixed precision auto on CPU")
    assert ("AVX-512 BF16" in precision.note) is not cpu_bf16


@pytest.mark.parametrize("capability", [SM70, SM80, SM90])
def test_an_explicit_precision_on_a_gpu_is_kept(capability: tuple[int, int]) -> None:
    for requested in ("no", "fp16", "bf16"):
        assert resolve_precision(requested, True, capability=capability).mixed_precision == requested


def test_auto_on_a_gpu_of_unknown_capability_is_fp16_and_a_bad_value_names_the_choices() -> None:
    assert resolve_precision("auto", on_gpu=True).mixed_precision == "fp16"
    with pytest.raises(ModelError, match="must be auto, no, fp16 or bf16, got 'fp8'"):
        resolve_precision("fp8", on_gpu=True, capability=SM90)


def test_the_flag_takes_auto_and_leaves_the_default_unset() -> None:
    assert resolve(["--mixed-precision", "auto"]).mixed_precision == "auto"
    assert resolve([]).mixed_precision is None  # the trainer then takes accelerate's, else auto


class CountReads(TorchDispatchMode):
    """Counts device-to-host reads (``.item()``, ``float(t)``, ``bool(t)``, ``.tolist()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads += 1
        return func(*args, **(kwargs or {}))


def _scaled_steps(optimizer: torch.optim.Optimizer, param: torch.nn.Parameter, steps: int = 3) -> int:
    """fp16's optimizer step as accelerate runs it (its patched ``step``, then the scaler's step and
    update); returns the reads the steps made."""
    scaler = torch.amp.GradScaler("cpu")
    optimizer.step = patch_optimizer_step(SimpleNamespace(), optimizer.step)  # type: ignore[method-assign]
    reads = 0
    for _ in range(steps):
        scaler.scale((param * torch.randn(param.shape)).sum()).backward()
        with CountReads() as count:
            scaler.step(optimizer)
            scaler.update()
        reads += count.reads
        optimizer.zero_grad()
    return reads


def test_with_the_fused_adam_the_grad_scaler_reads_nothing_back() -> None:
    param = torch.nn.Parameter(torch.randn(8, 4))
    assert _scaled_steps(adam([param], lr=1e-3), param) == 0
    plain = torch.nn.Parameter(torch.randn(8, 4))  # what the trainer had: one read per step at least
    assert _scaled_steps(torch.optim.Adam([plain], lr=1e-3), plain) >= 3


def test_a_checkpoint_of_a_plain_adam_loads_into_the_fused_one_and_it_stays_fused() -> None:
    torch.manual_seed(0)
    old_param = torch.nn.Parameter(torch.randn(8, 4))
    old = torch.optim.Adam([old_param], lr=1e-3)
    old_param.grad = torch.randn(8, 4)
    old.step()
    param = torch.nn.Parameter(old_param.detach().clone())
    fused = adam([param], lr=1e-3)
    fused.load_state_dict(old.state_dict())
    assert fused.param_groups[0]["fused"] is True and fused.param_groups[0]["foreach"] is None
    assert float(fused.state[param]["step"]) == 1.0
    param.grad = old_param.grad.clone()
    fused.step()
    old.step()
    torch.testing.assert_close(param, old_param)
