"""What a trainer's exit code tells the operator (docs/contract.md, "Exit codes")."""

from __future__ import annotations

SUCCESS = 0
FAILURE = 1  # a failure a restart may fix
LAUNCH = 2  # the launcher's bad environment, or the main address did not resolve in time
# EX_TEMPFAIL, "try again later": stopped by SIGTERM (a preemption, a pod deletion) after every rank
# finished its step and a step checkpoint was saved. Not a failure of the run; --resume continues.
STOPPED = 75
# EX_CONFIG: a restart cannot help (a bad flag, model, weights or data). The operator fails the training
# at once, and the Job's podFailurePolicy fails the Job on it.
PERMANENT = 78
