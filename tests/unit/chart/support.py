"""Shared helpers of the chart's unit tests: the real helm binary and the rendered chart."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "pets-training"
RELEASE = "pets"
NAMESPACE = "pets-system"

Manifest = list[dict[str, Any]]


def find_helm() -> str:
    """helm from $PETS_CACHE/bin (built by tests/cluster/build.sh), else from PATH; else fail."""
    cache = Path(os.environ.get("PETS_CACHE", Path.home() / ".cache" / "pets-training"))
    candidate = cache / "bin" / "helm"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which("helm")
    if found:
        return found
    pytest.fail(
        f"helm not found at {candidate} nor on PATH: build it with tests/cluster/build.sh "
        "(`make test-integration` does), then rerun",
        pytrace=False,
    )


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=False)


def template_args(*values_files: str, set_values: tuple[str, ...] = ()) -> list[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for f in values_files:
        args += ["--values", str(CHART / f)]
    for s in set_values:
        args += ["--set", s]
    return args


def render(helm: str, *values_files: str, set_values: tuple[str, ...] = ()) -> Manifest:
    """helm template of the chart with these values files (relative to the chart) and --set values."""
    args = template_args(*values_files, set_values=set_values)
    result = run_helm(helm, *args)
    assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def of_kind(manifest: Manifest, kind: str) -> Manifest:
    return [doc for doc in manifest if doc["kind"] == kind]


def one(manifest: Manifest, kind: str) -> dict[str, Any]:
    found = of_kind(manifest, kind)
    assert len(found) == 1, f"expected exactly one {kind}, got {[d['metadata']['name'] for d in found]}"
    return found[0]
