"""One version everywhere: pets_contract.__version__ is the source; the package, the chart, the default
images, every --version and the CHANGELOG follow it (docs/development.md, "Releases")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import version as installed_version
from pathlib import Path

import pytest
import yaml
from packaging.version import Version
from pets_operator import api

from pets_client import _api as client_api
from pets_contract import __version__

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?$")


def test_the_version_is_semver_and_the_chart_follows_it() -> None:
    assert SEMVER.match(__version__), __version__
    chart = yaml.safe_load((REPO / "charts" / "pets-training" / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (__version__, __version__)


def test_the_default_images_and_the_build_carry_it() -> None:
    assert api.DEFAULT_IMAGE == client_api.DEFAULT_IMAGE == f"pets-training/trainer:{__version__}"
    built = subprocess.run([str(REPO / "image" / "build.sh"), "version"], capture_output=True, text=True,
                           check=True, env={**os.environ, "PETS_PYTHON": sys.executable})
    assert built.stdout.strip() == __version__
    # pyproject's dynamic version, as pip normalizes it (0.2.0-dev is 0.2.0.dev0)
    assert Version(installed_version("pets-training")) == Version(__version__)


@pytest.mark.parametrize("command", [["pets-operator"], ["pets-train"], ["kubectl-pets"]])
def test_every_command_says_it(command: list[str]) -> None:
    tool = Path(sys.executable).parent / command[0]
    out = subprocess.run([str(tool), "--version"], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip().endswith(f" {__version__}"), out.stdout


def test_the_changelog_has_the_release_and_how_to_upgrade_to_it() -> None:
    text = (REPO / "CHANGELOG.md").read_text()
    # Between releases main is the next one's -dev, and its notes gather under "Unreleased".
    heading = "Unreleased" if __version__.endswith("-dev") else __version__
    section = re.search(rf"^## \[?{re.escape(heading)}\]?.*?(?=^## |\Z)", text, re.M | re.S)
    assert section, f"CHANGELOG.md has no '## {heading}' section"
    assert "### Upgrading" in section.group(0), f"CHANGELOG.md's {heading} section has no '### Upgrading'"
