from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file

from pets_training.model import (
    FrozenBackboneClassifier,
    ModelError,
    cpu_runs_bf16_natively,
    create_model,
    inner_model,
    resolve_precision,
    trainable_module,
)

from .helpers import PYTHON, SMALL_ARGS, run

pytestmark = pytest.mark.unit


def test_fp16_becomes_bf16_on_cpu_with_a_note() -> None:
    cpu = resolve_precision("fp16", on_gpu=False)
    assert cpu.mixed_precision == "bf16" and cpu.note and "fp16" in cpu.note
    assert resolve_precision("fp16", on_gpu=True).mixed_precision == "fp16"
    assert resolve_precision("no", on_gpu=False).note is None
    assert resolve_precision("bf16", on_gpu=False).note is None
    with pytest.raises(ModelError, match="got 'fp8'"):
        resolve_precision("fp8", on_gpu=False)


def test_on_a_cpu_without_bf16_instructions_fp16_becomes_none_and_bf16_is_kept_with_a_note() -> None:
    fp16 = resolve_precision("fp16", on_gpu=False, cpu_bf16=False)
    assert fp16.mixed_precision == "no" and fp16.note and "AVX-512 BF16" in fp16.note
    bf16 = resolve_precision("bf16", on_gpu=False, cpu_bf16=False)
    assert bf16.mixed_precision == "bf16" and bf16.note and "mixedPrecision: no" in bf16.note
    assert resolve_precision("no", on_gpu=False, cpu_bf16=False).note is None
    assert resolve_precision("fp16", on_gpu=True, cpu_bf16=False) == resolve_precision("fp16", on_gpu=True)
    assert isinstance(cpu_runs_bf16_natively(), bool)


def test_pets_cpu_bf16_forces_the_answer_and_a_bad_value_names_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for value, answer in (("1", True), ("0", False)):
        monkeypatch.setenv("PETS_CPU_BF16", value)
        assert cpu_runs_bf16_natively() is answer
    monkeypatch.setenv("PETS_CPU_BF16", "yes")
    with pytest.raises(ModelError, match=r"PETS_CPU_BF16 must be 1 \(bf16 instructions\) or 0 \(none\), "
                       "got 'yes'"):
        cpu_runs_bf16_natively()


@pytest.mark.timeout(120)
def test_a_real_run_maps_fp16_to_what_this_cpu_runs_natively(tmp_path: Path, cpu_bf16: bool) -> None:
    """fp16 (the default) on a CPU: bf16 where it has bf16 instructions, else none; the log says which."""
    args = [*SMALL_ARGS, "--mixed-precision", "fp16", "--epochs", "1", "--max-train-steps", "1",
            "--no-checkpoints", "--threads", "1", "--num-workers", "0", "--output-dir", str(tmp_path)]
    output, _ = run([PYTHON, "-m", "pets_training", *args], timeout=110)
    if cpu_bf16:
        assert "fp16 asked for on CPU: using bf16 instead" in output and "mixed precision bf16" in output
    else:
        assert "fp16 asked for on CPU: using none" in output and "mixed precision no" in output

def test_frozen_backbone_wrapper_computes_what_the_model_computes() -> None:
    torch.manual_seed(0)
    model = create_model("resnet10t", num_classes=5)
    reference = create_model("resnet10t", num_classes=5)
    reference.load_state_dict(model.state_dict())
    wrapped = trainable_module(model, unfreeze=False)
    assert isinstance(wrapped, FrozenBackboneClassifier) and inner_model(wrapped) is model
    x = torch.randn(4, 3, 48, 48)
    for mode in ("train", "eval"):
        getattr(wrapped, mode)()
        getattr(reference, mode)()
        assert torch.allclose(wrapped(x), reference(x), atol=1e-5)
    # train-mode BatchNorm statistics were updated identically
    assert torch.allclose(model.bn1.running_mean, reference.bn1.running_mean)
    # only the classifier is trainable, and only it gets gradients
    wrapped.train()
    wrapped(x).sum().backward()
    trainable = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    assert trainable == {"model.fc.weight", "model.fc.bias"}
    assert all(p.grad is None for n, p in wrapped.named_parameters() if n not in trainable)


def test_unfreeze_trains_everything() -> None:
    model = trainable_module(create_model("resnet10t", num_classes=3), unfreeze=True)
    assert all(p.requires_grad for p in model.parameters())


def test_local_weights_file_loads_without_its_classifier(tmp_path: Path) -> None:
    source = timm.create_model("resnet10t", num_classes=1000)
    path = tmp_path / "resnet10t.safetensors"
    save_file(source.state_dict(), str(path))
    model = create_model("resnet10t", num_classes=4, weights=str(path))
    assert torch.equal(model.conv1[0].weight, source.conv1[0].weight)
    assert model.get_classifier().out_features == 4


def test_bad_model_and_weights_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="'resnet9000' is not a timm model"):
        create_model("resnet9000", num_classes=2)
    with pytest.raises(ModelError, match=r"weights: file '.*missing.safetensors' does not exist"):
        create_model("resnet10t", num_classes=2, weights=str(tmp_path / "missing.safetensors"))
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"junk")
    with pytest.raises(ModelError, match=r"weights: '.*junk.safetensors' could not be loaded into resnet10t"):
        create_model("resnet10t", num_classes=2, weights=str(junk))
