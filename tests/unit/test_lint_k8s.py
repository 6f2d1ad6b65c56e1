"""`make lint-k8s` (tests/lint_k8s.py): its skip list and the docs say the same, and what it hands
checkov covers the PyTorchJob's pods with the init container the training-operator injects."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from pets_operator import render

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def lint_k8s() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lint_k8s", REPO / "tests" / "lint_k8s.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def documented_checks() -> set[str]:
    text = (REPO / "docs" / "operator.md").read_text()
    section = text.split("## Security checks (checkov)", 1)[1].split("\n## ", 1)[0]
    table = section.split("**Checks left failing**", 1)[1].split("\n\n", 2)[1]
    return set(re.findall(r"^(?:\| |- )`(CKV2?_K8S_\d+)`", table, re.M))  # a table's rows or a list's items


def test_every_skip_has_a_reason_and_is_in_the_docs() -> None:
    skips = lint_k8s().load_skips()
    assert skips, "an empty skip list: then the docs' table should go too"
    for skip in skips:
        assert re.fullmatch(r"CKV2?_K8S_\d+", skip["check"]), skip
        assert skip["resources"] and len(skip["reason"]) > 40, skip
    assert {s["check"] for s in skips} == documented_checks()


def test_the_pytorchjob_is_checked_as_a_job_per_replica_with_the_injected_init_container() -> None:
    training = yaml.safe_load((REPO / "examples" / "pytorchjob.yaml").read_text())
    [job] = [m for m in render.render_object(training, namespace="team-a") if m["kind"] == "PyTorchJob"]
    checkable = lint_k8s().as_checkable(job)
    assert [(c["kind"], c["metadata"]["name"]) for c in checkable] == [
        ("Job", "pets-pytorchjob-master"), ("Job", "pets-pytorchjob-worker")]
    master, worker = (c["spec"]["template"]["spec"] for c in checkable)
    assert "initContainers" not in master
    [init] = worker["initContainers"]
    assert init["name"] == "init-pytorch" and init["securityContext"]["allowPrivilegeEscalation"] is False
    assert worker["containers"] == master["containers"]
