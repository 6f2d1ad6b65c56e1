"""The PetsTraining API's names as the client needs them.

Kept here (not imported from pets_operator) so the client installs and imports on its own, with
`pip install .[client]`: no kopf, no torch. A unit test checks they match pets_operator.api.
"""

from __future__ import annotations

from importlib.metadata import version

# The distribution's version (pets_training.__version__), read without importing the trainer's package.
__version__ = version("pets-training")

GROUP = "training.pets.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PetsTraining"
PLURAL = "petstrainings"
DEFAULT_IMAGE = f"pets-training/trainer:{__version__}"
OUTPUT_DIR = "/output"
OUTPUT_CLAIM_SUFFIX = "-output"  # spec.output.managedClaim's claim: <training>-output (the operator's api)
GENERATE_NAME = "pets-"

SUCCEEDED = "Succeeded"
FAILED = "Failed"
FINISHED_PHASES = (SUCCEEDED, FAILED)

# What a training writes to its output directory (docs/trainer.md), and what `fetch` copies.
OUTPUT_FILES = ("summary.json", "progress.jsonl", "metrics.png", "model.safetensors", "config.yaml",
                "dataset.json")

# Pod labels of each backend's workload (the Job controller's and the Kubeflow training-operator's).
JOB_NAME_LABEL = "job-name"
JOB_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
KUBEFLOW_JOB_NAME_LABEL = "training.kubeflow.org/job-name"
KUBEFLOW_REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
KUBEFLOW_REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
TRAINER_CONTAINERS = ("trainer", "pytorch")  # the trainer container's name per backend
