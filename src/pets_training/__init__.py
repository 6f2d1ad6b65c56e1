"""The Pets trainer: Accelerate's "Pets" fine-tune (timm resnet50d) as a library, a CLI and a pod launcher.

Modules, top to bottom:

- ``contract``: the pod contract's reader: the environment ``pets_contract.env`` names (docs/contract.md).
- ``config``: the resolved training config (defaults < YAML file < flags) and its validation.
- ``data``: file names -> labels, the seeded split, the synthetic pets set, datasets and transforms.
- ``model``: the timm model, the frozen backbone, precision choice.
- ``resources``: CPU quota -> threads and DataLoader workers.
- ``checkpoint``: atomic per-epoch ``save_state`` and listing the complete checkpoints.
- ``progress``: progress lines/bar, progress.jsonl, Prometheus gauges, summary, plot.
- ``train``: ``training_function``, the one story from seed to summary (setup, resume, one epoch), with
  ``run_state`` (what a run holds), ``saves`` (its checkpoints: save, resume) and ``finish`` (weights,
  plot, summary).
- ``cli`` (``pets-train``), ``launch`` (``pets-launch``), ``bench`` and ``baseline`` (``make bench``).
"""

from pets_contract import __version__ as __version__  # the one source of the version
