"""spec.tracking -> the trainer's flags and environment (docs/watching.md). The trainer does the tracking
(pets_training.tracking): TensorBoard on the output, and an MLflow run that an attempt after a restart
continues (its id is kept on the output claim); the operator passes the spec on. What rank 0 reports back
is tracking_status's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pets_contract import env as contract_env
from pets_operator.rules import MLFLOW_ENV
from pets_operator.spec import Spec

# The Secret's keys that become the trainer's environment (MLflow's own names), each optional.
CREDENTIAL_KEYS = [name for name in MLFLOW_ENV if name != "MLFLOW_TRACKING_URI"]


def mlflow_of(spec: Spec) -> Mapping[str, Any] | None:
    return (spec.tracking or {}).get("mlflow")


def trainer_args(spec: Spec) -> list[str]:
    """The trainer's tracking flags (`pets-train --help`)."""
    tracking = spec.tracking or {}
    args = [] if tracking.get("tensorboard", True) else ["--no-tensorboard"]
    if (mlflow := mlflow_of(spec)) is not None:
        args += ["--mlflow-uri", mlflow["uri"], "--mlflow-experiment", mlflow["experiment"]]
    return args


def trainer_env(spec: Spec, namespace: str, name: str, uid: str) -> list[dict[str, Any]]:
    """With MLflow: the training's identity (the run's tags; the uid keeps a claim reused by a later
    training of the same name from continuing the earlier one's run), and the credentials from the Secret,
    as references only: their values never pass through the operator."""
    mlflow = mlflow_of(spec)
    if mlflow is None:
        return []
    env: list[dict[str, Any]] = [{"name": contract_env.TRAINING_NAMESPACE, "value": namespace},
                                 {"name": contract_env.TRAINING_NAME, "value": name}]
    if uid:
        env.append({"name": contract_env.TRAINING_UID, "value": uid})
    if secret := mlflow.get("credentialsSecret"):
        env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}}
                for key in CREDENTIAL_KEYS]
    return env
