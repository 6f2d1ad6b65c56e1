"""spec.checkpoint: step checkpoints by time and a save on SIGTERM, as trainer flags and the pods' grace."""

from __future__ import annotations

from typing import Any

import pytest
from operator_specs import TARGET, spec  # tests/unit/operator/operator_specs.py
from pets_operator import api, backends, builders

pytestmark = pytest.mark.unit


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_defaults_save_every_minute_and_give_the_pods_30_s_to_save_on_sigterm() -> None:
    assert api.resolve_spec({}).checkpoint == {"intervalSeconds": 60, "gracePeriodSeconds": 30}
    for backend in (backends.JOB, backends.PYTORCHJOB):
        for pod in _pods(backend.build_workload(spec(), TARGET)):
            assert pod["spec"]["terminationGracePeriodSeconds"] == 30
            (c,) = pod["spec"]["containers"]
            assert flag(c["args"], "--checkpoint-interval-seconds") == "60", c["args"]


def test_the_spec_sets_them_and_zero_means_epoch_checkpoints_only() -> None:
    s = spec(checkpoint={"intervalSeconds": 0, "gracePeriodSeconds": 120})
    (pod,) = _pods(backends.JOB.build_workload(s, TARGET))
    assert pod["spec"]["terminationGracePeriodSeconds"] == 120
    assert flag(pod["spec"]["containers"][0]["args"], "--checkpoint-interval-seconds") == "0"


@pytest.mark.parametrize(("checkpoint", "words"), [
    ({"gracePeriodSeconds": 2}, "spec.checkpoint.gracePeriodSeconds"),
    ({"intervalSeconds": -1}, "spec.checkpoint.intervalSeconds"),
])
def test_out_of_range_values_are_refused_naming_the_field(checkpoint: dict[str, int], words: str) -> None:
    with pytest.raises(api.SpecError, match=words):
        api.resolve_spec({"checkpoint": checkpoint})


def test_the_digest_covers_checkpoint_but_not_its_default() -> None:
    """A workload built before spec.checkpoint existed is not taken for one built from an edited spec
    (an upgrade restarts nothing), but an edit of it (while suspended) rebuilds the workload."""
    plain = api.resolve_spec({})
    before_the_field = {k: v for k, v in plain.to_dict().items() if k != "checkpoint"}
    assert builders.spec_digest(plain) == builders.spec_digest(before_the_field)
    edited = api.resolve_spec({"checkpoint": {"intervalSeconds": 10}})
    assert builders.spec_digest(edited) != builders.spec_digest(plain)
    assert "checkpoint" in api.immutable_while_running()


def test_an_unset_mixed_precision_trains_auto_and_digests_as_the_fp16_of_0_1_0() -> None:
    """The CRD stores no mixedPrecision: this operator passes auto, and digests it as 0.1.0, which fills in
    fp16, does, so a rollback keeps the workload (make test-upgrade's rollback test)."""
    plain = api.resolve_spec({})
    assert "mixedPrecision" not in plain.to_dict()
    args = builders.trainer_args(plain)
    assert args[args.index("--mixed-precision") + 1] == "auto"
    as_0_1_0 = {**plain.to_dict(), "mixedPrecision": "fp16"}
    assert builders.spec_digest(plain) == builders.spec_digest(as_0_1_0)
    assert builders.spec_digest(api.resolve_spec({"mixedPrecision": "bf16"})) != builders.spec_digest(plain)


def _pods(workload: dict[str, Any]) -> list[dict[str, Any]]:
    if workload["kind"] == "Job":
        return [workload["spec"]["template"]]
    return [r["template"] for r in workload["spec"]["pytorchReplicaSpecs"].values()]
