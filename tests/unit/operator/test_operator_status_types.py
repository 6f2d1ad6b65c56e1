"""The typed status: every field of the status schema is modelled, and a stored status round-trips."""

from __future__ import annotations

import pytest
from pets_operator.status_schema import STATUS_SCHEMA
from pets_operator.status_types import Status

from pets_contract import gauges

pytestmark = pytest.mark.unit


def test_every_field_of_the_schema_is_modelled() -> None:
    modelled = set(Status.from_dict({key: 1 for key in STATUS_SCHEMA["properties"]}).to_dict())
    assert modelled == set(STATUS_SCHEMA["properties"])
    assert Status.from_dict({key: 1 for key in STATUS_SCHEMA["properties"]}).extra == {}


def test_every_progress_gauge_feeds_a_modelled_field() -> None:
    for gauge in gauges.group(gauges.PROGRESS):
        assert str(gauge.field).split(".")[0] in STATUS_SCHEMA["properties"]


def test_a_stored_status_round_trips_with_what_it_does_not_model() -> None:
    stored = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}], "replicas": 2,
              "lastFailure": {"cause": "OOMKilled", "rank": 1}, "goodput": {"attempts": [{"attempt": 0}]},
              "workloadActive": False, "fromANewerOperator": {"x": [1]}, "extra": "kept too"}
    st = Status.from_dict(stored)
    assert st.to_dict() == stored
    assert st.phase == "Running" and st.last_failure == {"cause": "OOMKilled", "rank": 1}
    assert st.workload_active is False and st.extra == {"fromANewerOperator": {"x": [1]}, "extra": "kept too"}
    assert Status.from_dict({}).to_dict() == {}


def test_it_is_a_copy() -> None:
    stored = {"goodput": {"attempts": []}}
    st = Status.from_dict(stored)
    assert st.goodput is not None
    st.goodput["attempts"].append({"attempt": 0})
    assert stored == {"goodput": {"attempts": []}}
    again = st.copy()
    assert again == st and again.goodput is not st.goodput
