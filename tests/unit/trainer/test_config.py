from pathlib import Path

import pytest

from pets_training.config import ConfigError, TrainConfig, build_parser, load_yaml, resolve, to_yaml

pytestmark = pytest.mark.unit


def test_defaults_are_the_tutorial_recipe() -> None:
    cfg = resolve([])
    assert (cfg.model, cfg.image_size, cfg.batch_size, cfg.eval_batch_size) == ("resnet50d", 224, 64, 128)
    assert (cfg.epochs, cfg.lr, cfg.seed, cfg.train_fraction) == (5, 3e-2, 42, 0.8)
    assert cfg.unfreeze is False and cfg.data == "synthetic"


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
