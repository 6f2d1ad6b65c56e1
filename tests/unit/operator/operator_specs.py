"""Shared by the builder and backend tests: a resolved spec with overrides, a target, a container's env."""

from __future__ import annotations

from typing import Any

from pets_operator import api, builders

TARGET = builders.Target(name="pets", namespace="team-a", cluster_domain="example.local")


def spec(**overrides: Any) -> dict[str, Any]:
    return api.resolve_spec({"replicas": 3, "processesPerReplica": 2, **overrides})


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
