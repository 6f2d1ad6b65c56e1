"""The Pets trainer: Accelerate's "Pets" fine-tune (timm resnet50d) as a library, a CLI and a pod launcher.

Modules, top to bottom:

- ``contract``: the pod contract, the one reader of the environment (docs/contract.md).
- ``config``: the resolved training config (defaults < YAML file < flags) and its validation.
- ``data``: file names -> labels, the seeded split, the synthetic pets set, datasets and transforms.
- ``model``: the timm model, the frozen backbone, precision choice.
- ``resources``: CPU quota -> threads and DataLoader workers.
- ``checkpoint``: atomic per-epoch ``save_state`` and listing the complete checkpoints.
- ``progress``: progress lines/bar, progress.jsonl, Prometheus gauges, summary, plot.
- ``train``: ``training_function``, the one story from seed to summary (setup, resume, one epoch).
- ``cli`` (``pets-train``), ``launch`` (``pets-launch``), ``bench`` and ``baseline`` (``make bench``).
"""

# The one source of the version: the package, the images' tags, the chart (a unit test compares) and
# every --version read it. A release changes it here and in Chart.yaml, and adds a CHANGELOG entry.
__version__ = "0.1.0"
