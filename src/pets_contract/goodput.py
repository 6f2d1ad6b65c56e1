"""status.goodput's totals: where a training's wall time went, as the operator books it
(pets_operator.goodput) and the client shows it. Each is a number of seconds but the ratio."""

RATIO = "ratio"  # productive / wall
WALL = "wallSeconds"
PRODUCTIVE = "productiveSeconds"
STARTUP = "startupSeconds"
EVAL = "evalSeconds"
CHECKPOINT = "checkpointSeconds"
RESTORE = "restoreSeconds"
LOST = "lostSeconds"
RESIZING = "resizingSeconds"
WAITING = "waitingSeconds"
UNACCOUNTED = "unaccountedSeconds"
INPUT_WAIT = "inputWaitSeconds"  # a share of the training time, within productive and lost
