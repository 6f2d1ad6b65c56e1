"""Every test belongs to exactly the tier that runs it: unit, integration, e2e, upgrade, chaos or gpu.

`make test` runs `pytest -m unit tests/unit tests/cluster`; a test with no tier marker is silently
deselected there, and by `-m integration` and `-m e2e` as well, so it would never run anywhere.
Collection therefore fails, naming each such test, before any `-m` selection drops it.
"""

from __future__ import annotations

import pytest

TIERS = ("unit", "integration", "e2e", "upgrade", "chaos", "gpu")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects the unmarked tests out of sight
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    untiered = [item.nodeid for item in items if not any(item.get_closest_marker(t) for t in TIERS)]
    if untiered:
        raise pytest.UsageError(
            f"{len(untiered)} test(s) carry none of the tier markers {', '.join(TIERS)} and would never run"
            " (add e.g. `pytestmark = pytest.mark.unit` to the module):\n  " + "\n  ".join(untiered)
        )
