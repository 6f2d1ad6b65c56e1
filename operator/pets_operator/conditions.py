"""The phase and the standard conditions that follow from it (Progressing, Ready, Suspended, Succeeded,
Failed), with the Event a phase change emits."""

from __future__ import annotations

from pets_operator import api, goodput
from pets_operator.plan_types import Event, Plan, Round, set_condition
from pets_operator.timestamps import timestamp

# The type of the Event a change into these phases emits (the others' Events are their policies').
PHASE_EVENTS = {api.RUNNING: "Normal", api.SUCCEEDED: "Normal", api.FAILED: "Warning"}


def apply_phase(r: Round, plan: Plan) -> None:
    """The phase the policies decided (plan.verdict) written into the status, with its conditions."""
    assert plan.verdict is not None
    phase, reason, message = plan.verdict
    status, now, generation = plan.status, r.now, r.generation
    goodput.book_phase(status, r.old.phase, phase, now, r.observed.rank0_running_since)
    status.phase = phase
    status.message = message
    active = phase in (api.PENDING, api.RUNNING, api.RESTARTING)
    set_condition(status, "Progressing", active, reason if active else phase, message, now, generation)
    set_condition(status, "Ready", phase == api.RUNNING, reason, message, now, generation)
    for ctype, in_it in (("Suspended", api.SUSPENDED), ("Succeeded", api.SUCCEEDED), ("Failed", api.FAILED)):
        on = phase == in_it
        set_condition(status, ctype, on, reason if on else f"Not{ctype}", message if on else "", now,
                      generation)
    if phase != r.old.phase and (event_type := PHASE_EVENTS.get(phase)):
        plan.events.append(Event(event_type, phase, message))
    if phase == api.RUNNING and not status.start_time:
        status.start_time = timestamp(now)
