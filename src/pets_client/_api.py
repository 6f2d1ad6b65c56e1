"""The PetsTraining API's names as the client uses them: the contract's (pets_contract.names, which
imports neither kopf nor torch, so `pip install .[client]` is enough), and the client's own."""

from __future__ import annotations

from pets_contract import __version__
from pets_contract.names import (
    API_VERSION,
    APP_NAME,
    CLIENT_MANAGED_BY,
    DEFAULT_IMAGE,
    FINISHED_PHASES,
    GROUP,
    JOB_INDEX_LABEL,
    JOB_NAME_LABEL,
    KIND,
    KUBEFLOW_JOB_NAME_LABEL,
    KUBEFLOW_REPLICA_INDEX_LABEL,
    KUBEFLOW_REPLICA_TYPE_LABEL,
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    OUTPUT_CLAIM_SUFFIX,
    OUTPUT_DIR,
    OUTPUT_FILES,
    PLURAL,
    TRAINER_CONTAINERS,
    VERSION,
)

__all__ = [
    "API_VERSION", "APP_NAME", "CLIENT_MANAGED_BY", "DEFAULT_IMAGE", "FINISHED_PHASES", "GENERATE_NAME",
    "GROUP", "JOB_INDEX_LABEL", "JOB_NAME_LABEL", "KIND", "KUBEFLOW_JOB_NAME_LABEL",
    "KUBEFLOW_REPLICA_INDEX_LABEL", "KUBEFLOW_REPLICA_TYPE_LABEL", "LABEL_COMPONENT", "LABEL_MANAGED_BY",
    "LABEL_NAME", "OUTPUT_CLAIM_SUFFIX", "OUTPUT_DIR", "OUTPUT_FILES", "PLURAL", "TRAINER_CONTAINERS",
    "VERSION", "__version__",
]

GENERATE_NAME = "pets-"  # the name prefix of a training created without one
