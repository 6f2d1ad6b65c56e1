"""Fixtures for the chart's unit tests."""

from __future__ import annotations

import pytest

from .support import find_helm


@pytest.fixture(scope="session")
def helm() -> str:
    return find_helm()
