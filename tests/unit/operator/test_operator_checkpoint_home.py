"""status.checkpointDir (checkpoint_home.py): a new training's directory does not depend on its world
size, so a resize resumes; a training made by 0.1.0 keeps the directory that release gave it."""

from __future__ import annotations

from typing import Any

import pytest
from operator_specs import round_of, training  # tests/unit/operator/operator_specs.py
from pets_operator import api, backends, builders, checkpoint_home, plan_types
from pets_operator import plan as planner
from pets_operator.plan_types import Round
from pets_operator.status_types import Status
from test_operator_status import NOW

pytestmark = pytest.mark.unit

# What operator 0.1.0 (git tag v0.1.0, builders.checkpoint_dir) gave these specs: their checkpoints are there.
MADE_BY_0_1 = [
    ({"replicas": 2}, "/output/checkpoints/3f3096983dd1"),
    ({"replicas": 2, "epochs": 3, "dataset": {"synthetic": {"imagesPerClass": 4, "numClasses": 4}}},
     "/output/checkpoints/02669834329a"),
]
STARTED_BY_0_1 = {"phase": api.SUSPENDED, "attempt": 0, "restarts": 0, "backend": "job",
                  "children": {"service": "pets", "job": "pets"}}


def args_of(plan: plan_types.Plan) -> list[str]:
    (job,) = [c for c in plan.create if c["kind"] == "Job"]
    return list(job["spec"]["template"]["spec"]["containers"][0]["args"])


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def new_attempt(st: dict[str, Any], spec: dict[str, Any]) -> plan_types.Plan:
    resolved = api.resolve_spec(spec)
    target = builders.Target("pets", "ns", int(st.get("attempt") or 0))
    obs = plan_types.Observed(backend=backends.JOB, workload=None, service={})
    return planner.plan(Round.of(training(st, **spec), resolved, obs, target, NOW))


def chosen(spec: dict[str, Any], old: Status) -> str:
    """The directory checkpoint_home records for a training of `spec` whose stored status is `old`."""
    p = plan_types.Plan(status=old.copy())
    checkpoint_home.record(round_of(old, api.resolve_spec(spec)), p)
    return str(p.status.checkpoint_dir)


def test_a_new_trainings_directory_is_the_same_at_every_size() -> None:
    one, two = new_attempt({}, {"replicas": 1}), new_attempt({}, {"replicas": 2})
    assert one.status.checkpoint_dir == two.status.checkpoint_dir
    assert flag(args_of(two), "--checkpoint-dir") == two.status.checkpoint_dir
    assert two.status.checkpoint_dir == builders.checkpoint_dir(api.resolve_spec({"replicas": 2}))


@pytest.mark.parametrize(("spec", "directory"), MADE_BY_0_1)
def test_a_training_made_by_0_1_keeps_its_directory_across_the_upgrade_and_a_resize(
        spec: dict[str, Any], directory: str) -> None:
    assert chosen(spec, Status.from_dict(STARTED_BY_0_1)) == directory
    rebuilt = new_attempt({**STARTED_BY_0_1, "attempt": 1}, spec)
    assert rebuilt.status.checkpoint_dir == directory
    assert flag(args_of(rebuilt), "--checkpoint-dir") == directory
    # Once recorded, a resize keeps it: the shape without the world size is the same.
    resized = new_attempt({**rebuilt.status.to_dict(), "attempt": 2}, {**spec, "replicas": 1})
    assert flag(args_of(resized), "--checkpoint-dir") == directory


def test_a_new_shape_starts_afresh_beside_the_old_directory() -> None:
    first = new_attempt({}, {"replicas": 2, "epochs": 5})
    edited = new_attempt({**first.status.to_dict(), "attempt": 1}, {"replicas": 2, "epochs": 9})
    assert edited.status.checkpoint_dir != first.status.checkpoint_dir
    assert edited.status.checkpoint_dir == builders.checkpoint_dir(api.resolve_spec({"epochs": 9}))
    # It says so once, naming both directories (issue 40: an epochs edit lost 102 steps without a word).
    (reset,) = [e for e in edited.events if e.reason == "CheckpointReset"]
    assert reset.type == "Warning" and "starts from step 0" in reset.message, reset
    assert first.status.checkpoint_dir in reset.message and edited.status.checkpoint_dir in reset.message
    again = new_attempt({**edited.status.to_dict(), "attempt": 2}, {"replicas": 2, "epochs": 9})
    assert not [e for e in again.events if e.reason == "CheckpointReset"]
    assert not [e for e in first.events if e.reason == "CheckpointReset"]  # the first shape: nothing reset
    resized = new_attempt({**first.status.to_dict(), "attempt": 1}, {"replicas": 1, "epochs": 5})
    assert not [e for e in resized.events if e.reason == "CheckpointReset"]  # a resize keeps the shape
    # A 0.1.0 training with a recorded directory, edited to a new shape, gets this release's directory.
    shape = builders.checkpoint_shape(api.resolve_spec({"replicas": 2}))
    recorded = Status.from_dict({**STARTED_BY_0_1, "checkpointDir": MADE_BY_0_1[0][1],
                                 "checkpointShape": shape})
    assert chosen({"replicas": 2, "epochs": 9}, recorded) == \
        builders.checkpoint_dir(api.resolve_spec({"epochs": 9}))
