"""The harness's certificates and kubeconfigs: every kubeconfig a control-plane component reads can be
written from the control plane's own PKI step, before any node exists, and a missing certificate stops
the step instead of leaving an empty field (which made kube-scheduler run as system:anonymous on a
new machine: issue 20)."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

HERE = Path(__file__).resolve().parent


def bash(script: str, state: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PETS_STATE": str(state), **env}
    return subprocess.run(["bash", "-c", f"set -euo pipefail; source {HERE}/lib.sh; {script}"],
                          env=environ, capture_output=True, text=True, timeout=120)


def make_pki(state: Path, advertise_ip: str) -> None:
    subprocess.run([str(HERE / "control-plane.sh"), "pki"], check=True, capture_output=True, timeout=120,
                   env={**os.environ, "PETS_STATE": str(state), "PETS_ADVERTISE_IP": advertise_ip})


def subject_of(kubeconfig: Path) -> str:
    line = next(ln for ln in kubeconfig.read_text().splitlines() if "client-certificate-data:" in ln)
    pem = base64.b64decode(line.split(":", 1)[1].strip())
    assert pem, f"{kubeconfig} has an empty client certificate"
    return subprocess.run(["openssl", "x509", "-noout", "-subject"], input=pem, capture_output=True,
                          check=True, timeout=30).stdout.decode()


@pytest.mark.parametrize("user, common_name", [
    ("admin", "pets-admin"),
    ("kube-controller-manager", "system:kube-controller-manager"),
    ("kube-scheduler", "system:kube-scheduler"),
])
def test_the_control_planes_pki_makes_every_control_plane_kubeconfig(tmp_path: Path, user: str,
                                                                      common_name: str) -> None:
    make_pki(tmp_path, "192.0.2.10")
    out = bash(f"write_kubeconfig {tmp_path}/{user}.kubeconfig {user}", tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"CN = {common_name}" in subject_of(tmp_path / f"{user}.kubeconfig")


def test_a_new_node_address_makes_a_whole_new_pki(tmp_path: Path) -> None:
    make_pki(tmp_path, "192.0.2.10")
    first_ca = (tmp_path / "pki" / "ca.crt").read_bytes()
    make_pki(tmp_path, "192.0.2.10")
    assert (tmp_path / "pki" / "ca.crt").read_bytes() == first_ca  # same address: kept
    make_pki(tmp_path, "192.0.2.11")
    assert (tmp_path / "pki" / "ca.crt").read_bytes() != first_ca
    assert "IP:192.0.2.11" in (tmp_path / "pki" / ".sans").read_text()
    out = bash(f"write_kubeconfig {tmp_path}/s.kubeconfig kube-scheduler", tmp_path)
    assert out.returncode == 0, out.stderr


def test_a_kubeconfig_with_a_missing_certificate_is_refused_and_not_written(tmp_path: Path) -> None:
    make_pki(tmp_path, "192.0.2.10")
    (tmp_path / "pki" / "kube-scheduler.crt").unlink()
    out = bash(f"write_kubeconfig {tmp_path}/s.kubeconfig kube-scheduler; echo still-running", tmp_path)
    assert out.returncode != 0
    assert "still-running" not in out.stdout
    assert f"{tmp_path}/pki/kube-scheduler.crt is missing" in out.stderr
    assert not (tmp_path / "s.kubeconfig").exists()
