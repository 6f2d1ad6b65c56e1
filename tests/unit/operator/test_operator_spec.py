"""The typed resolved spec (pets_operator.spec): one field per field of the schema, and a lossless round
trip to the API's dict."""

from __future__ import annotations

import dataclasses

import pytest
from pets_operator import api
from pets_operator.spec import Spec, camel, snake

pytestmark = pytest.mark.unit

EVERY_FIELD = {
    "weights": "/data/w.safetensors",
    "mixedPrecision": "bf16",  # no stored default (unset: auto)
    "output": {"emptyDir": {}},
    "image": "pets:1",
    "imagePullSecrets": [{"name": "regcred"}],
    "nodeSelector": {"pool": "gpu"},
    "tolerations": [{"key": "gpu", "operator": "Exists"}],
    "affinity": {},
    "priorityClassName": "high",
    "serviceAccountName": "trainer",
    "env": [{"name": "HF_HOME", "value": "/cache"}],
    "activeDeadlineSeconds": 3600,
    "ttlSecondsAfterFinished": 60,
    "scheduling": {"pendingTimeoutSeconds": 600},
}
# Not with weights (one source of pretrained weights).
HUB_CACHE = {"pretrainedCache": {"persistentVolumeClaim": {"claimName": "hub", "path": "/"}}}


def test_every_schema_field_is_a_spec_field() -> None:
    properties = set(api.SPEC_SCHEMA["properties"])
    assert {camel(f.name) for f in dataclasses.fields(Spec)} == properties
    assert all(camel(snake(name)) == name for name in properties)
    assert set(EVERY_FIELD) | set(HUB_CACHE) | set(api.resolve_spec({}).to_dict()) == properties


@pytest.mark.parametrize("spec", [{}, EVERY_FIELD, HUB_CACHE], ids=["defaults", "every-field", "hub-cache"])
def test_the_dict_round_trip_is_lossless(spec: dict[str, object]) -> None:
    resolved = api.resolve_spec(spec)
    stored = resolved.to_dict()
    assert Spec.from_dict(stored) == resolved
    assert api.resolve_spec(stored) == resolved  # what the server stores resolves to the same Spec
    assert {k: stored[k] for k in spec} == spec  # set fields kept as they were (all given with defaults)
