"""What rank 0 says of its trackers -> status.tracking and the TrackingDegraded condition (docs/watching.md):
the MLflow run's id and URL, and its health, from rank 0's gauge (live) and summary (at an attempt's end).
What the pod wrote is not trusted: ids and URLs are checked, URLs and the warning redacted again."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pets_contract import gauges
from pets_contract import summary as summary_keys
from pets_contract import tracking as keys
from pets_contract.redact import has_userinfo, redact_urls
from pets_operator.plan_types import Plan, Round, set_condition

CONDITION = "TrackingDegraded"
FAILURES = gauges.BY_KEY["tracking_failures"].name  # rank 0's gauge: 1 once a tracking server failed
_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_URL = re.compile(r"^https?://[^\s]{1,1016}$")
WARNING_CHARS = 500


def _text(value: Any, pattern: re.Pattern[str]) -> str | None:
    return value if isinstance(value, str) and pattern.match(value) else None


def _from_summary(summary: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The summary's ``tracking`` object as status.tracking's fields (None: the summary has none)."""
    report = (summary or {}).get(summary_keys.TRACKING)
    if not isinstance(report, Mapping):
        return None
    out: dict[str, Any] = {}
    if run_id := _text(report.get(keys.MLFLOW_RUN_ID), _RUN_ID):
        out["mlflowRunId"] = run_id
    url = _text(report.get(keys.MLFLOW_URL), _URL)
    if url and not has_userinfo(url) and "?" not in url:  # MLflow's page is in its fragment: kept whole
        out["mlflowUrl"] = url
    if isinstance(report.get(keys.OK), bool):
        out["ok"] = report[keys.OK]
    if isinstance(warning := report.get(keys.WARNING), str) and warning:
        out["warning"] = redact_urls(" ".join(warning.split()))[:WARNING_CHARS]
    return out


def mirror(r: Round, plan: Plan) -> None:
    """status.tracking and TrackingDegraded from what rank 0 said last: its summary (an attempt's end:
    the run's id and URL, and whether the server took everything) or, while it runs, its gauge. A run
    continued by the next attempt keeps its id; nothing said keeps the status as it was."""
    status, progress, summary = plan.status, r.observed.progress, r.observed.summary
    now, generation = r.now, r.generation
    tracking = dict(status.tracking or {})
    report = _from_summary(summary)
    failing = (progress or {}).get(FAILURES)
    if report is not None:
        tracking = {k: v for k, v in tracking.items() if k not in ("ok", "warning")} | report
    elif failing is not None and failing > 0 and tracking.get("ok") is not False:
        tracking["ok"] = False
        tracking.pop("warning", None)
    elif failing == 0 and "ok" not in tracking:
        tracking["ok"] = True
    if not tracking:
        return
    status.tracking = tracking
    if tracking.get("ok") is False:
        said = tracking.get("warning") or "its log says why; the summary at the attempt's end will too"
        message = f"rank 0 could not write to the MLflow tracking server and trains on without it: {said}"
        set_condition(status, CONDITION, True, "TrackingServerFailed", message, now, generation)
    elif tracking.get("ok") is True:
        set_condition(status, CONDITION, False, "TrackingOK",
                      "the trackers took every call so far" if report is None
                      else "the tracking server took the whole run", now, generation)
