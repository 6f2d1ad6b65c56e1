"""Faithful by default: the tutorial's pretrained resnet50d, from the hub, a hub cache, or one file; and
where the hub cannot be reached, an immediate permanent failure that says what to do."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pets_training import hubcache, model
from pets_training.hubcache import HubFile, make_hub_cache

from .helpers import BIN, Tripwire, closed_port, read_json

pytestmark = pytest.mark.unit

# the recipe's own model and settings, on a tiny set at a tiny size (the model is what is tested)
TINY_DATA = [
    "--synthetic-classes", "2",
    "--synthetic-images-per-class", "4",
    "--train-fraction", "0.5",
    "--epochs", "1",
    "--batch-size", "4",
    "--eval-batch-size", "4",
    "--num-workers", "0",
]  # fmt: skip


def _hub_env(tmp_path: Path, endpoint: str) -> dict[str, str]:
    """No way to the hub but ``endpoint``, and an empty default hub cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "PETS_EXIT_CODE"))}
    (tmp_path / "empty-hub-cache").mkdir(exist_ok=True)
    return {**env, "HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(tmp_path / "empty-hub-cache")}


def _pets_train(args: list[str], tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "pets-train"), *args, "--output-dir", str(tmp_path / "out"),
         "--summary-path", str(tmp_path / "termination-log")],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def test_the_recipe_model_loads_timm_resnet50d_ra2_in1k_model_safetensors() -> None:
    assert hubcache.hub_file("resnet50d") == HubFile("timm/resnet50d.ra2_in1k", "model.safetensors", None)
    assert hubcache.hub_file("resnet50d").repo_dir(Path("/c")) == Path(  # type: ignore[union-attr]
        "/c/models--timm--resnet50d.ra2_in1k"
    )


@pytest.mark.timeout(120)  # the bound on a hang; "no retries" is asserted below, not timed
def test_an_unreachable_hub_fails_at_once_saying_what_to_do(tmp_path: Path) -> None:
    """The defaults (pretrained resnet50d from the hub) where the hub cannot be reached: exit 78 after one
    request, not after minutes of retries, with the three ways out in the termination summary."""
    proc = _pets_train(TINY_DATA, tmp_path, _hub_env(tmp_path, f"http://127.0.0.1:{closed_port()}"))
    assert proc.returncode == 78, proc.stderr[-3000:]
    error = read_json(tmp_path / "termination-log")["error"]
    assert "\n" not in error
    assert error.startswith("pretrained: cannot reach the Hugging Face hub (http://127.0.0.1:")
    assert "timm/resnet50d.ra2_in1k/model.safetensors" in error and "Connection refused" in error
    for way_out in (
        "spec.pretrained / --pretrained",
        "`hf download timm/resnet50d.ra2_in1k --cache-dir DIR`",
        "(spec.pretrainedCache / --pretrained-cache DIR)",
        "(spec.weights / --weights FILE)",
        "spec.pretrained: false (--no-pretrained) for random init",
    ):
        assert way_out in error
    assert "Retrying" not in proc.stderr


@pytest.fixture(scope="module")
def resnet50d_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A hub cache holding (random-init) resnet50d weights in the exact layout `hf download` writes."""
    cache = tmp_path_factory.mktemp("hub-cache")
    yield cache, make_hub_cache(cache, "resnet50d")


def test_make_hub_cache_writes_the_hub_layout(resnet50d_cache: tuple[Path, Path]) -> None:
    cache, snapshot = resnet50d_cache
    repo = cache / "models--timm--resnet50d.ra2_in1k"
    commit = (repo / "refs" / "main").read_text()
    assert len(commit) == 40 and snapshot == repo / "snapshots" / commit / "model.safetensors"
    assert snapshot.is_symlink() and snapshot.resolve().parent == repo / "blobs"
    # readable by others, as `hf download` leaves it: a cache volume is read by the trainer's uid 65532
    assert snapshot.resolve().stat().st_mode & 0o004, oct(snapshot.resolve().stat().st_mode)
    source = HubFile("timm/resnet50d.ra2_in1k", "model.safetensors")
    assert hubcache.cached_file(source, cache) == str(snapshot)


@pytest.mark.timeout(240)
def test_a_hub_cache_loads_its_exact_weights_without_a_network_call(
    resnet50d_cache: tuple[Path, Path], tmp_path: Path
) -> None:
    cache, snapshot = resnet50d_cache
    tripwire = Tripwire()  # HF_ENDPOINT: a request would connect here
    try:
        args = [*TINY_DATA, "--pretrained-cache", str(cache), "--image-size", "32", "--max-train-steps", "1",
                "--no-checkpoints", "--mixed-precision", "no"]  # fmt: skip
        proc = _pets_train(args, tmp_path, _hub_env(tmp_path, tripwire.url))
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert tripwire.connections() == 0
    finally:
        tripwire.close()
    assert "from the hub cache" in proc.stderr and "offline" in proc.stderr
    trained = load_file(str(tmp_path / "out" / "model.safetensors"))
    cached = load_file(str(snapshot))
    for name in ("conv1.0.weight", "layer1.0.conv1.weight", "layer4.2.conv3.weight"):  # frozen backbone
        assert torch.equal(trained[name], cached[name]), name
    assert trained["fc.weight"].shape == (2, 2048) and cached["fc.weight"].shape == (1000, 2048)


def test_an_empty_or_missing_cache_names_the_flag_and_how_to_fill_it(tmp_path: Path) -> None:
    from huggingface_hub import constants

    offline = constants.HF_HUB_OFFLINE
    with pytest.raises(model.ModelError, match=r"pretrained_cache: directory '.*nope' does not exist"):
        model.create_model("resnet10t", 2, pretrained=True, pretrained_cache=str(tmp_path / "nope"))
    with pytest.raises(
        model.ModelError,
        match=r"pretrained_cache: '.*' has no usable resnet10t weights .*"
        r"`hf download timm/resnet10t.c3_in1k --cache-dir .*`",
    ):
        model.create_model("resnet10t", 2, pretrained=True, pretrained_cache=str(tmp_path))
    assert constants.HF_HUB_OFFLINE == offline  # offline mode only while the model is made


def test_without_the_hub_weights_already_in_the_default_cache_are_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    snapshot = make_hub_cache(tmp_path, "resnet10t", seed=1)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(hubcache, "unreachable", lambda source, timeout: OSError("no route to host"))
    made = model.create_model("resnet10t", 3, pretrained=True)
    assert torch.equal(made.state_dict()["conv1.0.weight"], load_file(str(snapshot))["conv1.0.weight"])
