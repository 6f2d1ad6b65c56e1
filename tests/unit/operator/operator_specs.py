"""Shared by the operator's tests: a resolved spec with overrides, a target, a container's env, a stored
training, a round for one policy and a plan's condition."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from pets_operator import api, backends, builders, mirror, plan_types
from pets_operator.spec import Spec
from pets_operator.status_types import Status

TARGET = builders.Target(name="pets", namespace="team-a", cluster_domain="example.local")
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
DEFAULTS = api.resolve_spec({})


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


def round_of(old: Status | None = None, spec: Spec | None = None, now: datetime = NOW,
             target: builders.Target = TARGET, **observed: Any) -> plan_types.Round:
    """A round of the stored training pets (generation 3): its status `old`, its spec (default: all
    defaults), and what was observed (a Job backend and no workload, unless said)."""
    seen = plan_types.Observed(**({"backend": backends.JOB, "workload": None} | observed))
    return plan_types.Round(old or Status(), seen, target, now, {"generation": 3, "uid": "u1"},
                            resolved=spec or DEFAULTS)


def mirror_into(status: Status, *, progress: dict[str, float] | None = None,
                summary: dict[str, Any] | None = None, epochs: int = 5, now: datetime = NOW) -> Status:
    """`status`, with what a round mirrors into it from rank 0's gauges or its final summary."""
    r = round_of(spec=dataclasses.replace(DEFAULTS, epochs=epochs), now=now, progress=progress,
                 summary=summary)
    p = plan_types.Plan(status=status)
    if progress is not None:
        mirror.progress(r, p)
    if summary is not None:
        mirror.summary(r, p)
    return status
