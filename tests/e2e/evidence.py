"""What a failed e2e test leaves behind: every live tenant namespace's trainings (their whole status and
`lastFailure`), its Events, its pods' last log lines, and the operator's log.

conftest.py calls `keep` from its report hook when a test fails, before the fixtures delete the
namespaces and the release. The files go under $PETS_STATE/logs/evidence/<test>/ (CI keeps the state
root of a failed run); a summary goes into the failure's report, where pytest prints it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from trainings import GROUP, LIVE_TENANTS, OPERATOR_NAMESPACE, PLURAL, RELEASE, VERSION, Trainings, kubectl

POD_LOG_LINES = 40  # each container's last lines in the report (the files hold 400)


def evidence_dir(nodeid: str) -> Path:
    state = Path(os.environ.get("PETS_STATE", "/tmp/pets-training-cluster"))
    return state / "logs" / "evidence" / re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid)[-150:]


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _pod_logs(namespace: str, pod: Any, lines: int) -> str:
    """Each container's last lines; the previous instance's too where the container restarted."""
    out = []
    for status in [*(pod.status.init_container_statuses or []), *(pod.status.container_statuses or [])]:
        runs = [("", [])] + ([(" (previous)", ["--previous"])] if status.restart_count else [])
        for label, flag in runs:
            got = kubectl("-n", namespace, "logs", pod.metadata.name, "-c", status.name, f"--tail={lines}",
                          *flag, check=False)
            out.append(f"--- pod {pod.metadata.name} container {status.name}{label} "
                       f"(restarts {status.restart_count}):\n{got.stdout}{got.stderr}")
    return "\n".join(out)


def tenant_evidence(tenant: Trainings, lines: int) -> str:
    """One namespace: each training's status and lastFailure, the Events, every pod's logs."""
    ns = tenant.namespace
    out = [f"===== namespace {ns}"]
    try:
        items = tenant.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
    except Exception as exc:  # evidence is best effort: the failure itself is what the report shows
        items, out = [], [*out, f"(listing the trainings failed: {exc})"]
    for item in items:
        status = item.get("status") or {}
        out.append(f"--- training {item['metadata']['name']}: phase {status.get('phase')}, restarts "
                   f"{status.get('restarts')}, attempt {status.get('attempt')}\nlastFailure: "
                   f"{json.dumps(status.get('lastFailure'))}\nstatus: {json.dumps(status, indent=1)}")
    events = kubectl("-n", ns, "get", "events", "--sort-by=.lastTimestamp", check=False)
    out.append(f"--- events:\n{_tail(events.stdout + events.stderr, lines * 2)}")
    try:
        pods = tenant.core.list_namespaced_pod(ns).items
    except Exception as exc:
        pods, out = [], [*out, f"(listing the pods failed: {exc})"]
    out += [_pod_logs(ns, pod, lines) for pod in pods]
    return "\n".join(out)


def operator_log(lines: int) -> str:
    got = kubectl("-n", OPERATOR_NAMESPACE, "logs", "-l", f"app.kubernetes.io/instance={RELEASE}",
                  "--all-containers", "--prefix", f"--tail={lines}", check=False)
    return f"===== the operator's log ({OPERATOR_NAMESPACE}):\n{got.stdout}{got.stderr}"


def keep(nodeid: str) -> str:
    """Write the evidence of every live tenant and the operator's log; return the report's summary."""
    where = evidence_dir(nodeid)
    where.mkdir(parents=True, exist_ok=True)
    for tenant in LIVE_TENANTS:
        (where / f"{tenant.namespace}.txt").write_text(tenant_evidence(tenant, POD_LOG_LINES * 10))
    operator = operator_log(5000)
    (where / "operator.log").write_text(operator)
    summary = [tenant_evidence(tenant, POD_LOG_LINES) for tenant in LIVE_TENANTS]
    # the report's tail of the operator's log without its probes' access lines (the file keeps them)
    decisions = "\n".join(line for line in operator.splitlines() if "GET /healthz" not in line)
    return "\n".join([*summary, _tail(decisions, 100), f"(all of it in {where})"])
