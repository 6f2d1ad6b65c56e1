"""A Python client for PetsTrainings (training.pets.dev/v1alpha1) and the `kubectl pets` plugin.

    from pets_client import PetsTrainingClient

    pets = PetsTrainingClient()                 # the kubeconfig's current context and namespace
    name = pets.train(epochs=2, replicas=2)     # validated by the API server; returns the name
    status = pets.wait(name)                    # a live bar from a watch; the final status
    pets.fetch(name, "out/")                    # the outputs, with spec.output.persistentVolumeClaim
    pets.upload("images/", claim="pets-data")   # a folder into a claim; train(dataset="images/") too
    with pets.tensorboard(name) as tb:          # TensorBoard over the output claim, at tb.url
        tb.wait()

Needs only kubernetes, PyYAML and tqdm (`pip install .[client]`): importing it never imports torch.
"""

from __future__ import annotations

from .client import PetsTrainingClient, build_training
from .errors import (
    FetchError,
    InvalidTrainingError,
    LogsError,
    PetsClientError,
    TensorBoardError,
    TrainingDeletedError,
    TrainingNotFoundError,
    UploadError,
    WaitTimeoutError,
)
from .upload import UploadResult

__all__ = [
    "FetchError",
    "InvalidTrainingError",
    "LogsError",
    "PetsClientError",
    "PetsTrainingClient",
    "TensorBoardError",
    "TrainingDeletedError",
    "TrainingNotFoundError",
    "UploadError",
    "UploadResult",
    "WaitTimeoutError",
    "build_training",
]
