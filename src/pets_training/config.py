"""The training config: defaults (the tutorial's recipe) < YAML file (``--config``) < command-line flags.

Every field of :class:`TrainConfig` is a flag (``image_size`` -> ``--image-size``) and a YAML key
(``image_size`` or ``image-size``). The flags are generated from the dataclass, so the two cannot drift.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import __version__
from .contract import PermanentError

MIXED_PRECISION_CHOICES = ("auto", "no", "fp16", "bf16")


class ConfigError(PermanentError):
    """A bad flag or config value; the message names the flag or field (or file) and the value."""


class _Parser(argparse.ArgumentParser):
    """Bad flags raise ConfigError (a permanent failure, exit 78) instead of exiting 2 with the usage."""

    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(f"{self.prog}: {message}")


def _f(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class TrainConfig:
    # data
    data: str = _f("synthetic", "a directory of <label>_<n>.jpg images, or 'synthetic' for the built-in set")
    synthetic_classes: int = _f(37, "classes in the synthetic set")
    synthetic_images_per_class: int = _f(20, "images per class in the synthetic set")
    data_layout: str = _f(
        "auto",
        "how the directory names classes: flat (<label>_<n>.jpg), oxford (the Oxford-IIIT Pet archive's "
        "images/ folder), imagefolder (a folder per class), or auto (detected)",
        choices=("auto", "flat", "oxford", "imagefolder"),
    )
    train_fraction: float = _f(0.8, "share of the images used for training (seeded split)")
    # model
    model: str = _f("resnet50d", "any timm model name")
    pretrained: bool = _f(
        True,
        "start from the model's pretrained weights: from the hub (needs internet), a hub cache "
        "(--pretrained-cache) or one file (--weights); --no-pretrained: random init",
    )
    pretrained_cache: str | None = _f(
        None,
        "a Hugging Face hub cache directory holding the pretrained weights, read offline (air-gapped "
        "clusters; fill it with `hf download timm/resnet50d.ra2_in1k --cache-dir DIR`)",
    )
    weights: str | None = _f(
        None, "one local file (safetensors or torch) of the pretrained weights (air-gapped clusters)"
    )
    unfreeze: bool = _f(False, "train the whole network instead of only the classifier")
    # recipe
    image_size: int = _f(224, "training crop and eval resize, in pixels")
    batch_size: int = _f(64, "training batch size per process")
    global_batch_size: int | None = _f(
        None,
        "samples of one optimizer step, all processes together; recorded when the training first starts "
        "and kept at any world size that divides it (by gradient accumulation); a multiple of batch_size x "
        "processes. Default: batch_size x processes at the first start",
    )
    eval_batch_size: int = _f(
        128,
        "no longer used: evaluation runs in batches of --batch-size, the last padded and masked, so the "
        "model sees one input shape (kept so that existing commands run)",
    )
    epochs: int = _f(5, "epochs in the whole run")
    lr: float = _f(3e-2, "OneCycleLR max_lr; Adam starts at lr/25")
    seed: int = _f(42, "seed for the split, the shuffling and the augmentation")
    mixed_precision: str | None = _f(
        None,
        "auto, no, fp16 or bf16. auto picks bf16 on a GPU of compute capability 8.0 or more (no "
        "GradScaler: nothing read back per step), fp16 on an older GPU (with a fused Adam), and on a CPU "
        "bf16 where it has bf16 instructions (AVX-512 BF16, AMX), else no. fp16 on a CPU becomes bf16, or "
        "no without bf16 instructions. Default: what accelerate launch says, else auto",
        choices=MIXED_PRECISION_CHOICES,
    )
    # speed (none of these change what is computed, only how fast)
    channels_last: bool = _f(True, "channels_last memory format for the model and its inputs")
    fast_decode: bool = _f(True, "decode JPEGs with torchvision.io (libjpeg-turbo) instead of PIL")
    input_path: str = _f(
        "auto",
        "where training images are decoded and cropped: cpu (the DataLoader workers), device (workers read "
        "the files; one batched decode and the crops on the device: nvJPEG on a GPU), auto (device where a "
        "GPU JPEG decoder works, else cpu, with a log line)",
        choices=("auto", "cpu", "device"),
    )
    input_store: str | None = _f(
        None,
        "decode every image of the data directory once into a store under this directory (one per set "
        "of files; rebuilt when a file changes) and read it instead of decoding; one per machine",
    )
    threads: int | None = _f(
        None, "torch threads per process; default: CPU quota / processes on this machine"
    )
    num_workers: int | None = _f(None, "DataLoader workers per process; default: from the CPU quota")
    # run control
    output_dir: str | None = _f(
        None, "where progress, summary, weights and plot go; default $PETS_OUTPUT_DIR or ./output"
    )
    checkpoint_dir: str | None = _f(
        None, "checkpoint directory; default <output-dir>/checkpoints"
    )
    checkpoints: bool = _f(True, "save an accelerate checkpoint every epoch")
    keep_checkpoints: int = _f(
        2, "how many checkpoints to keep, epoch and step ones together (the oldest are removed)"
    )
    checkpoint_interval_seconds: float = _f(
        0.0,
        "also save a step checkpoint mid-epoch once this many seconds have passed since the last save "
        "(rank 0's clock); 0: only at epoch ends",
    )
    resume: bool = _f(False, "continue from the newest complete checkpoint, if there is one")
    max_epochs_this_run: int | None = _f(None, "stop (resumably) after this many epochs in this run")
    max_train_steps: int | None = _f(None, "stop after this many training steps in total (smoke runs, bench)")
    summary_path: str | None = _f(
        None, "also write the final summary JSON here (the operator: /dev/termination-log)"
    )
    metrics_port: int | None = _f(
        None, "serve Prometheus gauges on this port from rank 0 (the operator: 9090)"
    )
    log_every: float = _f(30.0, "seconds between progress lines when stderr is not a terminal")
    # tracking (docs/watching.md): Accelerate's trackers, from rank 0
    tensorboard: bool = _f(True, "write TensorBoard event files under <output-dir>/tensorboard")
    mlflow_uri: str | None = _f(
        None,
        "an MLflow tracking server (http://host:5000) to log the run to; credentials only from the "
        "environment (MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN)",
    )
    mlflow_experiment: str = _f("pets-training", "the MLflow experiment of the run (made if missing)")
    tracking_log_steps: int = _f(
        10, "training steps between the loss, learning rate and images/s points the trackers get"
    )
    tracking_timeout: float = _f(
        30.0,
        "seconds the end of a run waits for the MLflow server (the last artifacts, the run's status) "
        "before it gives up with a warning; the training itself never waits for it",
    )

    def resolved_output_dir(self, default: str | None = None) -> Path:
        """``default``: the pod's PETS_OUTPUT_DIR (:attr:`.contract.PodContract.output_dir`)."""
        return Path(self.output_dir or default or "output")

    def resolved_checkpoint_dir(self, default_output: str | None = None) -> Path:
        if self.checkpoint_dir:
            return Path(self.checkpoint_dir)
        return self.resolved_output_dir(default_output) / "checkpoints"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_HINTS = typing.get_type_hints(TrainConfig)


def _base_type(name: str) -> type:
    hint = _HINTS[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


# a field's type -> the values it accepts (a bool is no number), and what its error calls them
_ACCEPTS: dict[type, tuple[tuple[type, ...], str]] = {
    bool: ((bool,), "true or false"),
    int: ((int,), "an integer"),
    float: ((int, float), "a number"),
    str: ((str,), "a string"),
}


def coerce(name: str, value: Any, where: str = "") -> Any:
    """Check one value against the field's type; ``where`` says where it came from (for the error)."""
    prefix = f"{where}: " if where else ""
    if value is None:
        if type(None) in typing.get_args(_HINTS[name]):  # an optional field
            return None
        raise ConfigError(f"{prefix}{name} must not be empty")
    kind = _base_type(name)
    accepted, wanted = _ACCEPTS[kind]
    wrong = not isinstance(value, accepted) or (kind is not bool and isinstance(value, bool))
    if wrong:
        raise ConfigError(f"{prefix}{name} must be {wanted}, got {value!r}")
    return float(value) if kind is float else value


def load_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML config file; keys may use dashes or underscores."""
    if not path.is_file():
        raise ConfigError(f"--config: file {str(path)!r} does not exist")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"--config: {path} is not valid YAML: {err}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"--config: {path} must hold a mapping of settings, got {type(raw).__name__}")
    return _settings(raw, str(path), f"{path}: ")


def _settings(raw: Mapping[Any, Any], where: str, prefix: str = "") -> dict[str, Any]:
    """``raw``'s settings by field name (keys may use dashes), each checked by :func:`coerce`."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in FIELDS:
            raise ConfigError(f"{prefix}unknown setting {key!r} (known: {', '.join(sorted(FIELDS))})")
        out[name] = coerce(name, value, where)
    return out


# the fields with a least value, in the order they are checked ("image_size" twice: below 1 is said as such)
_AT_LEAST = (
    ("image_size", 1), ("batch_size", 1), ("eval_batch_size", 1), ("epochs", 1),
    ("synthetic_images_per_class", 1), ("image_size", 16), ("synthetic_classes", 2), ("threads", 1),
    ("max_epochs_this_run", 1), ("max_train_steps", 1), ("global_batch_size", 1), ("keep_checkpoints", 1),
    ("tracking_log_steps", 1),
)


def validate(cfg: TrainConfig) -> TrainConfig:
    """Range checks; raises ConfigError naming the field and the value."""
    for name, least in _AT_LEAST:
        value = getattr(cfg, name)
        if value is not None and value < least:  # None: an optional field left unset
            raise ConfigError(f"{name} must be at least {least}, got {value}")
    if not 0.0 < cfg.train_fraction < 1.0:
        raise ConfigError(f"train_fraction must be between 0 and 1 (exclusive), got {cfg.train_fraction}")
    if cfg.lr <= 0:
        raise ConfigError(f"lr must be positive, got {cfg.lr}")
    if cfg.mixed_precision is not None and cfg.mixed_precision not in MIXED_PRECISION_CHOICES:
        raise ConfigError(
            f"mixed_precision must be one of {MIXED_PRECISION_CHOICES}, got {cfg.mixed_precision!r}"
        )
    if cfg.num_workers is not None and cfg.num_workers < 0:
        raise ConfigError(f"num_workers must be 0 or more, got {cfg.num_workers}")
    if cfg.metrics_port is not None and not 0 < cfg.metrics_port < 65536:
        raise ConfigError(f"metrics_port must be a TCP port (1-65535), got {cfg.metrics_port}")
    if cfg.checkpoint_interval_seconds < 0:
        raise ConfigError(
            f"checkpoint_interval_seconds must be 0 (off) or more, got {cfg.checkpoint_interval_seconds}"
        )
    if cfg.log_every <= 0:
        raise ConfigError(f"log_every must be positive, got {cfg.log_every}")
    _check_weight_source(cfg)
    _check_tracking(cfg)
    return cfg


def _check_tracking(cfg: TrainConfig) -> None:
    from urllib.parse import urlsplit

    if cfg.tracking_timeout <= 0:
        raise ConfigError(f"tracking_timeout must be positive, got {cfg.tracking_timeout}")
    if not cfg.mlflow_experiment.strip():
        raise ConfigError("mlflow_experiment must not be empty")
    if cfg.mlflow_uri is not None and "@" in urlsplit(cfg.mlflow_uri).netloc:
        # the URI is in the pod's args, config.yaml and the run's params: no secret may ride in it
        raise ConfigError(
            "--mlflow-uri (mlflow_uri) holds credentials (user@ or user:password@): give them in "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) instead"
        )


def _check_weight_source(cfg: TrainConfig) -> None:
    """Pretrained weights come from one source: the hub, a hub cache (--pretrained-cache) or a file
    (--weights); random init (--no-pretrained) has none."""
    if cfg.weights is not None and cfg.pretrained_cache is not None:
        raise ConfigError(
            f"--weights {cfg.weights!r} and --pretrained-cache {cfg.pretrained_cache!r} are two sources of "
            "the pretrained weights (weights, pretrained_cache): give one"
        )
    if not cfg.pretrained:
        for name, value in (("weights", cfg.weights), ("pretrained_cache", cfg.pretrained_cache)):
            if value is not None:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(
                    f"--no-pretrained (pretrained: false) asks for random init, but {flag} {value!r} "
                    f"({name}) is a source of pretrained weights: drop --no-pretrained or {flag}"
                )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pets-train",
        description="Fine-tune a timm model on Pets-style images (the Accelerate 'Pets' recipe). "
        "Settings: defaults < --config FILE < flags. Run 'pets-train make-synthetic --help' to write "
        "the synthetic set as JPEGs.",
        argument_default=argparse.SUPPRESS,  # only flags given on the command line land in the namespace
    )
    parser.add_argument("--config", type=Path, help="YAML file of settings (keys are the flag names)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = _base_type(f.name)
        help_text = f"{f.metadata['help']} (default: {f.default})"
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        else:
            parser.add_argument(
                flag, type=kind, help=help_text, choices=f.metadata.get("choices"), metavar=f.name.upper()
            )
    return parser


def resolve(
    argv: Sequence[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> TrainConfig:
    """Defaults < YAML (``--config``) < flags < ``overrides`` (for the library and notebook path)."""
    args = vars(build_parser().parse_args(list(argv) if argv is not None else []))
    values: dict[str, Any] = {}
    config_file = args.pop("config", None)
    if config_file is not None:
        values.update(load_yaml(Path(config_file)))
    values.update(args)
    values.update(_settings(overrides or {}, "config"))
    return validate(TrainConfig(**values))


def to_yaml(cfg: TrainConfig) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
