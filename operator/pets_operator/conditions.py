"""The phase and the standard conditions that follow from it (Progressing, Ready, Suspended, Succeeded,
Failed), with the Event a phase change emits."""

from __future__ import annotations

from datetime import datetime

from pets_operator import api, goodput
from pets_operator.backends import timestamp
from pets_operator.plan_types import Event, Plan, set_condition

# The type of the Event a change into these phases emits (the others' Events are their policies').
PHASE_EVENTS = {api.RUNNING: "Normal", api.SUCCEEDED: "Normal", api.FAILED: "Warning"}


def apply_phase(result: Plan, old_phase: str | None, phase: str, reason: str, message: str,
                 now: datetime, generation: int | None, rank0_started: str | None = None) -> None:
    status = result.status
    goodput.book_phase(status, old_phase, phase, now, rank0_started)
    status.phase = phase
    status.message = message
    active = phase in (api.PENDING, api.RUNNING, api.RESTARTING)
    set_condition(status, "Progressing", active, reason if active else phase, message, now, generation)
    set_condition(status, "Ready", phase == api.RUNNING, reason, message, now, generation)
    for ctype, in_it in (("Suspended", api.SUSPENDED), ("Succeeded", api.SUCCEEDED), ("Failed", api.FAILED)):
        on = phase == in_it
        set_condition(status, ctype, on, reason if on else f"Not{ctype}", message if on else "", now,
                      generation)
    if phase != old_phase and (event_type := PHASE_EVENTS.get(phase)):
        result.events.append(Event(event_type, phase, message))
    if phase == api.RUNNING and not status.start_time:
        status.start_time = timestamp(now)
