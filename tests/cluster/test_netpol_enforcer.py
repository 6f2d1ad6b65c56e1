"""Which NetworkPolicy enforcer the harness builds and starts (lib.sh netpol_enforcer): the one asked
for by name, else kube-network-policies where the kernel takes nftables' `queue` statement and
kube-router where it does not; anything else is refused naming the variable and the value. And the switch
that has `cluster.sh up` start one (PETS_NETPOL, make cluster-up POLICY=): 0 or 1, else refused up front."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

HERE = Path(__file__).resolve().parent


def enforcer(tmp_path: Path, choice: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PETS_NETPOL_ENFORCER"}
    if choice is not None:
        env["PETS_NETPOL_ENFORCER"] = choice
    env["PETS_STATE"] = str(tmp_path)
    return subprocess.run(["bash", "-c", f"set -euo pipefail; source {HERE}/lib.sh; netpol_enforcer"],
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("choice", ["kube-network-policies", "kube-router"])
def test_an_enforcer_asked_for_by_name_is_taken(tmp_path: Path, choice: str) -> None:
    result = enforcer(tmp_path, choice)
    assert (result.returncode, result.stdout.strip()) == (0, choice), result.stderr


def test_an_unknown_enforcer_is_refused_naming_the_variable_and_the_value(tmp_path: Path) -> None:
    result = enforcer(tmp_path, "calico")
    assert result.returncode != 0
    assert "PETS_NETPOL_ENFORCER" in result.stderr and "'calico'" in result.stderr, result.stderr


def test_auto_follows_whether_the_kernel_takes_the_nft_queue_statement(tmp_path: Path) -> None:
    # Without nft, or without the right to add a table, the probe fails too: kube-router.
    probe = subprocess.run(["bash", "-c", f"source {HERE}/lib.sh; nft_queue_works"],
                           env={**os.environ, "PETS_STATE": str(tmp_path)}, timeout=60)
    expected = "kube-network-policies" if probe.returncode == 0 else "kube-router"
    for choice in (None, "auto"):
        result = enforcer(tmp_path, choice)
        assert (result.returncode, result.stdout.strip()) == (0, expected), result.stderr


@pytest.mark.parametrize("value", ["yes", "2", ""])
def test_cluster_up_refuses_a_policy_switch_other_than_0_or_1_before_starting_anything(
        tmp_path: Path, value: str) -> None:
    # "" is what `make cluster-up POLICY=` passes: refused too, rather than read as either.
    state = tmp_path / "state"
    result = subprocess.run([str(HERE / "cluster.sh"), "up", "local"],
                            env={**os.environ, "PETS_STATE": str(state), "PETS_NETPOL": value},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "PETS_NETPOL" in result.stderr and f"'{value}'" in result.stderr, result.stderr
    assert not state.exists()
