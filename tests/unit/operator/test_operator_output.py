"""Where a training without spec.output writes: the operator's default, chosen once
(reconcile._resolve_output)."""

from __future__ import annotations

from typing import Any

import pytest
from pets_operator import api, children, context, reconcile
from pets_operator.settings import Settings
from pets_operator.status_types import Status

pytestmark = pytest.mark.unit


def resolve(monkeypatch: pytest.MonkeyPatch, default_output: dict[str, Any], has_default: bool | None,
            old_status: dict[str, Any] | None = None) -> tuple[tuple[dict[str, Any], str], list[str]]:
    asked: list[str] = []

    def has_default_storage_class(api_client: Any) -> bool | None:
        asked.append("storageclasses")
        return has_default

    monkeypatch.setattr(reconcile, "has_default_storage_class", has_default_storage_class)
    ctx = context.Context(api_client=None,  # type: ignore[arg-type]
                           settings=Settings(default_output=default_output))
    return reconcile._resolve_output(ctx, Status.from_dict(old_status or {})), asked


def test_the_default_is_a_claim_where_the_cluster_has_a_default_class(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve(monkeypatch, api.default_output(), True) == \
        ((api.default_output(), children.OPERATOR_DEFAULT), ["storageclasses"])
    # Not allowed to list StorageClasses (None): taken that there is one; a Pending claim says otherwise.
    assert resolve(monkeypatch, api.default_output(), None)[0] == \
        (api.default_output(), children.OPERATOR_DEFAULT)


def test_no_default_class_falls_back_to_an_emptydir(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve(monkeypatch, api.default_output(), False)[0] == \
        ({"emptyDir": {}}, children.NO_DEFAULT_STORAGE_CLASS)


def test_a_named_class_or_an_emptydir_default_asks_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    named = api.default_output("managedClaim", "5Gi", "fast")
    assert resolve(monkeypatch, named, False) == ((named, children.OPERATOR_DEFAULT), [])
    assert resolve(monkeypatch, {"emptyDir": {}}, False) == \
        (({"emptyDir": {}}, children.OPERATOR_DEFAULT), [])


def test_once_chosen_the_choice_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A later default (the chart changed, a default class added) never moves a training's work."""
    old = {"output": {"emptyDir": {}}, "outputReason": children.NO_DEFAULT_STORAGE_CLASS}
    assert resolve(monkeypatch, api.default_output(), True, old) == \
        (({"emptyDir": {}}, children.NO_DEFAULT_STORAGE_CLASS), [])
