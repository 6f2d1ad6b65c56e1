"""Where a training's checkpoints live (status.checkpointDir), chosen so that no work is left behind by a
resize or by an operator upgrade.

The directory is `<output>/checkpoints/<digest of the fields that shape a checkpoint>`
(builders.CHECKPOINT_SHAPE): an edit that changes the shape (epochs 5 -> 9) starts afresh beside the
old checkpoints, and one that keeps it resumes. The world size left the shape in 0.2.0 (a step
checkpoint holds the global position, so a run resumes from it at any size). A training made by an
operator up to 0.1.0 keeps the directory that operator gave it (its shape with the world size) for as
long as its shape stays: its checkpoints are there.
"""

from __future__ import annotations

from pets_operator import builders
from pets_operator.plan_types import Event, Plan, Round
from pets_operator.spec import Spec
from pets_operator.status_types import Status


def _made_by_0_1(status: Status) -> bool:
    """The training had a workload before this operator recorded a checkpoint directory for it."""
    return status.checkpoint_shape is None and bool(status.attempt is not None
                                                    or (status.children or {}).get("job")
                                                    or (status.children or {}).get("pytorchJob"))


def _global_batch(spec: Spec) -> int:
    """Samples of one optimizer step at the largest size the training may take."""
    most = int((spec.elastic or {}).get("maxReplicas") or spec.replicas)
    return spec.batch_size * spec.processes_per_replica * most


def _shape_changed(old: Status, directory: str, shape: str) -> str | None:
    """What to tell the user when an edit changed the shape: the next attempt starts from step 0, and the
    old checkpoints stay where they were (None: the shape is the one recorded, or none was)."""
    before = old.checkpoint_shape
    if not before or before == shape:
        return None
    fields = ", ".join(builders.CHECKPOINT_SHAPE)
    return (f"the edit changed a field that shapes a checkpoint (one of {fields}): the next attempt "
            f"starts from step 0 in {directory}; the checkpoints of the old shape stay in "
            f"{old.checkpoint_dir}. An epochs edit is one: OneCycleLR's schedule spans all the "
            "epochs, so no step of the old one is a step of the new")


def record(r: Round, plan: Plan) -> None:
    """status.checkpointDir, checkpointShape and globalBatch, and a CheckpointReset Event when an edit
    changed the shape."""
    status, old = plan.status, r.old
    directory, shape, batch = _choose(r.spec, old)
    status.checkpoint_dir, status.checkpoint_shape, status.global_batch = directory, shape, batch or None
    if reset := _shape_changed(old, directory, shape):
        plan.events.append(Event("Warning", "CheckpointReset", reset))


def _choose(spec: Spec, status: Status) -> tuple[str, str, int | None]:
    """The directory the training's workloads use, the shape it was chosen for and the global batch (to
    be kept in the status): the recorded ones while the shape stays, else those of this shape."""
    shape = builders.checkpoint_shape(spec)
    if status.checkpoint_dir and status.checkpoint_shape == shape:
        return str(status.checkpoint_dir), shape, status.global_batch
    if _made_by_0_1(status):
        return builders.checkpoint_dir(spec, builders.CHECKPOINT_SHAPE_0_1), shape, None
    return builders.checkpoint_dir(spec), shape, _global_batch(spec)
