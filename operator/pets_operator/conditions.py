"""The phase and the standard conditions that follow from it (Progressing, Ready, Suspended, Succeeded,
Failed), with the Event a phase change emits."""

from __future__ import annotations

from datetime import datetime

from pets_operator import api, goodput
from pets_operator.backends import timestamp
from pets_operator.plan_types import Event, Plan, set_condition


def apply_phase(result: Plan, old_phase: str | None, phase: str, reason: str, message: str,
                 now: datetime, generation: int | None) -> None:
    status = result.status
    conditions = status["conditions"]
    goodput.book_phase(status, old_phase, phase, now)
    status["phase"] = phase
    status["message"] = message
    active = phase in (api.PENDING, api.RUNNING, api.RESTARTING)
    set_condition(conditions, "Progressing", active, reason if active else phase, message, now, generation)
    set_condition(conditions, "Ready", phase == api.RUNNING, reason, message, now, generation)
    set_condition(conditions, "Suspended", phase == api.SUSPENDED, reason if phase == api.SUSPENDED
                   else "NotSuspended", message if phase == api.SUSPENDED else "", now, generation)
    set_condition(conditions, "Succeeded", phase == api.SUCCEEDED, reason if phase == api.SUCCEEDED
                   else "NotSucceeded", message if phase == api.SUCCEEDED else "", now, generation)
    set_condition(conditions, "Failed", phase == api.FAILED, reason if phase == api.FAILED
                   else "NotFailed", message if phase == api.FAILED else "", now, generation)
    if phase != old_phase:
        if phase in (api.RUNNING, api.SUCCEEDED):
            result.events.append(Event("Normal", phase, message))
        elif phase == api.FAILED:
            result.events.append(Event("Warning", phase, message))
    if phase == api.RUNNING and not status.get("startTime"):
        status["startTime"] = timestamp(now)
