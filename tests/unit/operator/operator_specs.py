"""Shared by the operator's tests: a resolved spec with overrides, a target, a container's env, a stored
training and a plan's condition."""

from __future__ import annotations

from typing import Any

from pets_operator import api, builders, plan_types
from pets_operator.status_types import Status

TARGET = builders.Target(name="pets", namespace="team-a", cluster_domain="example.local")


def spec(**overrides: Any) -> dict[str, Any]:
    return api.resolve_spec({"replicas": 3, "processesPerReplica": 2, **overrides})


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def training(status: dict[str, Any] | Status | None = None, **spec: Any) -> dict[str, Any]:
    """The stored training pets in ns (generation 3); a plan's typed status as the API server holds it."""
    return {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": "pets", "namespace": "ns", "generation": 3, "uid": "u1"},
            "spec": spec, "status": status.to_dict() if isinstance(status, Status) else status or {}}


def condition(plan: plan_types.Plan, ctype: str) -> dict[str, Any]:
    return next(c for c in plan.status.conditions if c["type"] == ctype)
