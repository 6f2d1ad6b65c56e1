"""Polling with a deadline, shared by the integration and e2e tests (pytest's `pythonpath` puts tests/
on sys.path). The API offers watches, but a poll names what it waited for and the last value seen."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 60.0, interval: float = 0.2) -> Any:
    """Poll `probe` until it returns something truthy; fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}; last seen: {last!r}", pytrace=False)
