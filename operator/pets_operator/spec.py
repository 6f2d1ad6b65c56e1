"""The resolved PetsTraining spec, typed: what `api.resolve_spec` returns (the API's defaults applied,
its rules checked) and what the planner and the builders read. It becomes the API's dict again only at
the API edge (`to_dict`: the spec digest, comparisons with the stored object).

Fields are the spec's in snake_case; an optional field left unset is None. Nested objects stay the
API's mappings, read-only here: most travel into the pod as they are (nodeSelector, env, affinity...).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from pets_operator.rules import DATASET_SOURCES

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Spec:
    replicas: int
    processes_per_replica: int
    epochs: int
    batch_size: int
    learning_rate: float
    seed: int
    model: str
    pretrained: bool
    freeze_backbone: bool
    image_size: int
    dataset: Obj
    image_pull_policy: str
    resources: Obj
    placement: Obj
    checkpoint: Obj
    backend: str
    network_policy: bool
    master_port: int
    max_restarts: int
    suspend: bool
    tracking: Obj
    mixed_precision: str | None = None  # None: unset (no CRD default, see schema.py), which is auto
    weights: str | None = None
    pretrained_cache: Obj | None = None
    output: Obj | None = None  # None: the operator's default output (api.output_of)
    image: str | None = None  # None: the operator's --default-image
    image_pull_secrets: Sequence[Obj] | None = None
    node_selector: Mapping[str, str] | None = None
    tolerations: Sequence[Obj] | None = None
    affinity: Obj | None = None
    priority_class_name: str | None = None
    service_account_name: str | None = None
    env: Sequence[Obj] | None = None
    active_deadline_seconds: int | None = None
    ttl_seconds_after_finished: int | None = None
    scheduling: Obj | None = None
    elastic: Obj | None = None  # None: a stored object from before the field (its default, {})

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any]) -> Spec:
        """A spec as the API server stores it (defaulted and valid: `api.resolve_spec` checks it)."""
        return cls(**{snake(key): value for key, value in spec.items()})

    def to_dict(self) -> dict[str, Any]:
        """The spec as the API server stores it: camelCase, unset fields absent."""
        return {camel(f.name): value for f in fields(self) if (value := getattr(self, f.name)) is not None}

    @property
    def dataset_source(self) -> str:
        """Which dataset source it sets: exactly one, by the rule resolve_spec applied."""
        return next(key for key in DATASET_SOURCES if key in self.dataset)


def camel(name: str) -> str:
    return re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)


def snake(name: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)
