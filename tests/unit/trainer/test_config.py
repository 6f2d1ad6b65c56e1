from pathlib import Path

import pytest
import timm
import torch

from pets_training.config import ConfigError, TrainConfig, build_parser, load_yaml, resolve, to_yaml
from pets_training.train import Normalise

pytestmark = pytest.mark.unit


def test_defaults_are_the_tutorial_recipe() -> None:
    """Left alone, the recipe is the tutorial's: pretrained resnet50d (from the hub), frozen backbone,
    224 px crops and resizes, batch 64, OneCycle max_lr 3e-2, 5 epochs, the model's own mean/std."""
    cfg = resolve([])
    assert cfg == TrainConfig() and resolve(build_parser_defaults()) == cfg
    assert cfg.pretrained is True and (cfg.weights, cfg.pretrained_cache) == (None, None)  # from the hub
    assert (cfg.model, cfg.image_size, cfg.batch_size, cfg.eval_batch_size) == ("resnet50d", 224, 64, 128)
    assert (cfg.epochs, cfg.lr, cfg.seed, cfg.train_fraction) == (5, 3e-2, 42, 0.8)
    assert cfg.unfreeze is False and cfg.data == "synthetic"
    with torch.device("meta"):  # the architecture and its pretrained_cfg, no weights
        model = timm.create_model(cfg.model)
    assert model.pretrained_cfg["hf_hub_id"] == "timm/resnet50d.ra2_in1k"
    normalise = Normalise(model, torch.device("cpu"), channels_last=False)
    assert model.pretrained_cfg["mean"] == (0.485, 0.456, 0.406)  # ImageNet's, the weights' own
    assert model.pretrained_cfg["std"] == (0.229, 0.224, 0.225)
    mean, std = torch.tensor(model.pretrained_cfg["mean"]), torch.tensor(model.pretrained_cfg["std"])
    assert torch.allclose(normalise.shift.flatten(), mean / std)
    assert torch.allclose(normalise.scale.flatten(), 1 / (255 * std))


def build_parser_defaults() -> list[str]:
    """The same defaults spelled out as flags, as the operator may pass them."""
    return ["--pretrained", "--model", "resnet50d", "--no-unfreeze", "--image-size", "224",
            "--batch-size", "64", "--lr", "0.03", "--epochs", "5"]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--no-pretrained", "--weights", "/w.safetensors"],
         r"--no-pretrained .* but --weights '/w.safetensors' .*: drop --no-pretrained or --weights"),
        (["--no-pretrained", "--pretrained-cache", "/hub"],
         r"--no-pretrained .* but --pretrained-cache '/hub' .*: drop --no-pretrained or --pretrained-cache"),
        (["--weights", "/w.safetensors", "--pretrained-cache", "/hub"],
         r"--weights '/w.safetensors' and --pretrained-cache '/hub' are two sources .*: give one"),
    ],
)  # fmt: skip
def test_pretrained_weights_come_from_one_source(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(argv)


def test_a_file_or_a_cache_is_the_source_of_the_pretrained_weights(tmp_path: Path) -> None:
    assert resolve(["--weights", "/w.safetensors"]).pretrained is True
    assert resolve(["--pretrained", "--weights", "/w.safetensors"]).weights == "/w.safetensors"
    file = tmp_path / "c.yaml"
    file.write_text("pretrained_cache: /hub\n")
    assert resolve(["--config", str(file)]).pretrained_cache == "/hub"
    file.write_text("pretrained-cache: /hub\npretrained: false\n")
    with pytest.raises(ConfigError, match="--no-pretrained"):
        resolve(["--config", str(file)])
    assert resolve(["--no-pretrained"]).pretrained is False


def test_flags_override_yaml_which_overrides_defaults(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("epochs: 7\nimage-size: 128\nmodel: resnet18\nchannels_last: false\n")
    cfg = resolve(["--config", str(file), "--epochs", "2", "--unfreeze"])
    assert cfg.epochs == 2  # flag wins
    assert cfg.image_size == 128 and cfg.model == "resnet18" and cfg.channels_last is False  # from the file
    assert cfg.unfreeze is True and cfg.batch_size == 64  # flag, default


def test_every_field_is_a_flag() -> None:
    help_text = build_parser().format_help()
    for name in TrainConfig.__dataclass_fields__:
        assert "--" + name.replace("_", "-") in help_text


def test_yaml_errors_name_the_file_and_key(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("epochz: 3\n")
    with pytest.raises(ConfigError, match=r"c.yaml: unknown setting 'epochz'"):
        load_yaml(file)
    file.write_text("epochs: three\n")
    with pytest.raises(ConfigError, match=r"epochs must be an integer, got 'three'"):
        load_yaml(file)
    file.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_yaml(file)
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--epochs", "0"], "epochs must be at least 1, got 0"),
        (["--train-fraction", "1.5"], "train_fraction must be between 0 and 1"),
        (["--lr", "-1"], "lr must be positive, got -1.0"),
        (["--image-size", "8"], "image_size must be at least 16, got 8"),
        (["--synthetic-classes", "1"], "synthetic_classes must be at least 2, got 1"),
        (["--metrics-port", "70000"], "metrics_port must be a TCP port"),
    ],
)
def test_bad_values_name_the_field_and_value(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(argv)


def test_overrides_from_a_dict_are_checked() -> None:
    assert resolve(overrides={"epochs": 2, "image-size": 32}).image_size == 32
    with pytest.raises(ConfigError, match="unknown setting 'nope'"):
        resolve(overrides={"nope": 1})
    with pytest.raises(ConfigError, match="batch_size must be an integer, got '8'"):
        resolve(overrides={"batch_size": "8"})


def test_resolved_config_round_trips_through_yaml(tmp_path: Path) -> None:
    cfg = resolve(["--epochs", "3", "--weights", "/w.safetensors"])
    file = tmp_path / "config.yaml"
    file.write_text(to_yaml(cfg))
    assert resolve(["--config", str(file)]) == cfg
