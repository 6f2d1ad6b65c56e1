"""tests/conftest.py: a test with no tier marker fails collection, even under `-m unit`, which would
otherwise deselect it in silence (as it did the work queue's and the scraper's tests)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def _pytest(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_sample.py").write_text(body)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-c", str(REPO / "pyproject.toml"),
         "--rootdir", str(tmp_path), "--confcutdir", str(tmp_path), *args, str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )


def test_a_test_without_a_tier_marker_fails_collection_by_name(tmp_path: Path) -> None:
    res = _pytest(tmp_path, (
        "import pytest\n\n"
        "@pytest.mark.unit\n"
        "def test_marked():\n    pass\n\n"
        "def test_forgotten():\n    pass\n"
    ), "-m", "unit")
    out = res.stdout + res.stderr
    assert res.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert "test_sample.py::test_forgotten" in out
    assert "test_marked" not in out.split("would never run", 1)[1]  # only the unmarked one is named
    assert "deselected" not in out and "passed" not in out


@pytest.mark.parametrize("tier", ["unit", "integration", "e2e"])
def test_a_test_with_its_tier_marker_is_collected(tmp_path: Path, tier: str) -> None:
    res = _pytest(tmp_path, f"import pytest\n\npytestmark = pytest.mark.{tier}\n\ndef test_ok():\n    pass\n",
                  "-m", tier)
    out = res.stdout + res.stderr
    assert res.returncode == pytest.ExitCode.OK, out
    assert "1 passed" in out and "deselected" not in out
