"""spec.ttlSecondsAfterFinished: a finished training deletes itself, and so every child, that many
seconds after it finished."""

from __future__ import annotations

from pets_operator.plan_types import Plan, Round
from pets_operator.timestamps import parse_timestamp


def after_finished(r: Round, plan: Plan) -> None:
    """Delete the training once its TTL has passed since status.completionTime; else come back then."""
    ttl = r.spec.ttl_seconds_after_finished
    done = plan.status.completion_time
    if ttl is None or not done:
        return
    if (left := (parse_timestamp(done) - r.now).total_seconds() + ttl) <= 0:
        plan.delete_self = True
    else:
        plan.requeue_after = left
