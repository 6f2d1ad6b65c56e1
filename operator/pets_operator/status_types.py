"""The PetsTraining's status, typed: what the planner reads and writes (plan.plan and its policies). It
is made from the stored dict where a round reads the object, and becomes the API's dict again only at the
API edge (`to_dict`: the status patch, comparisons with the stored status).

Fields are status_schema's in snake_case; a field left unset is None (absent from the dict). Nested
objects stay the API's dicts, which the policies edit in place. A field this operator does not model (a
newer operator's) is kept in `extra` as it was read, so a round never drops it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from pets_operator.spec import camel

Obj = dict[str, Any]


@dataclass
class Status:
    phase: str | None = None
    message: str | None = None
    observed_generation: int | None = None
    conditions: list[Obj] | None = None
    backend: str | None = None
    backend_reason: str | None = None
    replicas: int | None = None
    selector: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_shape: str | None = None
    global_batch: int | None = None
    resize_refused: int | None = None
    resize: Obj | None = None
    active_replicas: int | None = None
    ready_replicas: int | None = None
    restarts: int | None = None
    attempt: int | None = None
    workload_active: bool | None = None
    queue: Obj | None = None
    progress: str | None = None
    epoch: int | None = None
    total_epochs: int | None = None
    train_loss: float | None = None
    eval_accuracy: float | None = None
    images_per_second: float | None = None
    elapsed_seconds: float | None = None
    eta_seconds: float | None = None
    last_progress_time: str | None = None
    summary: Obj | None = None
    start_time: str | None = None
    completion_time: str | None = None
    pending_since: str | None = None
    disruptions: int | None = None
    step: int | None = None
    steps_total: int | None = None
    resume_step: int | None = None
    resume_skipped_checkpoints: int | None = None
    dataset: Obj | None = None
    last_failure: Obj | None = None
    deadline: Obj | None = None
    goodput: Obj | None = None
    tracking: Obj | None = None
    last_checkpoint: Obj | None = None
    output: Obj | None = None
    output_reason: str | None = None
    children: dict[str, str] | None = None
    extra: Obj = field(default_factory=dict)  # fields not modelled here, kept as they were read

    @classmethod
    def from_dict(cls, status: Mapping[str, Any]) -> Status:
        """A stored status, deep-copied (JSON-only): the planner edits its nested objects in place."""
        copied = json.loads(json.dumps(dict(status)))
        known = {key: copied.pop(key) for key in list(copied) if key in _FIELDS}
        return cls(**{_FIELDS[key]: value for key, value in known.items()}, extra=copied)

    def to_dict(self) -> dict[str, Any]:
        """The status as the API server stores it: camelCase, unset fields absent."""
        out = {camel(f.name): value for f in fields(self)
               if f.name != "extra" and (value := getattr(self, f.name)) is not None}
        return out | self.extra

    def copy(self) -> Status:
        return Status.from_dict(self.to_dict())

    @property
    def current_attempt(self) -> int:
        """The attempt the training is at: status.attempt, or one per restart where it was stored before
        that field existed."""
        return int((self.restarts or 0) if self.attempt is None else self.attempt)


_FIELDS = {camel(f.name): f.name for f in fields(Status) if f.name != "extra"}
