"""The PetsTraining's status schema: what the operator writes and a user reads."""

from __future__ import annotations

from typing import Any

from pets_contract import goodput as totals
from pets_contract.names import PHASES
from pets_operator.schema import _bool, _int, _obj, _seconds, _str


def _num(description: str) -> dict[str, Any]:
    return {"type": "number", "description": description}


def _time(description: str) -> dict[str, Any]:
    return {"type": "string", "format": "date-time", "description": description}


_CONDITION = _obj("A standard condition (metav1.Condition).", {
    "type": _str("Ready, Progressing, Succeeded, Failed or Suspended."),
    "status": _str("True, False or Unknown.", enum=["True", "False", "Unknown"]),
    "reason": _str("CamelCase reason."),
    "message": _str("Human readable message."),
    "lastTransitionTime": _time("When status changed."),
    "observedGeneration": {"type": "integer", "format": "int64", "description": "Generation observed."},
}, required=["type", "status"])

STATUS_SCHEMA: dict[str, Any] = _obj("Observed state, written by the operator.", {
    "phase": _str(", ".join(PHASES[:-1]) + f" or {PHASES[-1]}.", enum=PHASES),
    "message": _str("What is happening, and what to do about it."),
    "observedGeneration": {"type": "integer", "format": "int64",
                           "description": "metadata.generation the status reflects."},
    "conditions": {"type": "array", "items": _CONDITION, "description": "Standard conditions.",
                   "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    "backend": _str("The backend in use: job or pytorchjob."),
    "backendReason": _str("Why that backend: spec.backend, or what auto means on this operator."),
    "replicas": _int("Pods of the current attempt's gang: the size it runs at (spec.replicas is the size "
                     "asked for; they differ while a resize drains, and where the cluster had room for "
                     "fewer, within spec.elastic.minReplicas). The scale subresource's status replicas."),
    "selector": _str("The label selector of the training's trainer pods (the scale subresource's)."),
    "checkpointDir": _str("Where the training's checkpoints are (in its output), kept while the fields "
                          "that shape a checkpoint stay: a restart or a resize resumes from there."),
    "checkpointShape": _str("The digest of those fields when checkpointDir was chosen (bookkeeping)."),
    "globalBatch": _int("Samples of one optimizer step, all pods together, fixed when the checkpoint "
                        "directory is chosen: spec.batchSize x processesPerReplica x elastic.maxReplicas "
                        "(else replicas). The trainer keeps it at every size by gradient accumulation, so "
                        "a resize is only to a size that divides it."),
    "resizeRefused": _int("A spec.replicas the training cannot run at (it cannot keep globalBatch): it runs "
                          "on at its size, and a ResizeRefused Warning Event says why."),
    "resize": _obj("The resize under way, from the drain of the old gang until the new one runs "
                   "(docs/operator.md, \"Resizing a training\").", {
        "from": _int("The size it ran at."),
        "to": _int("The size the next attempt runs at."),
        "asked": _int("spec.replicas when it began: a later change is a new size asked for, which the next "
                      "attempt takes."),
        "reason": _str("Scaled (spec.replicas changed), NodeLost (the gang did not fit again after a node "
                       "loss) or PartialAdmission (Kueue admitted fewer pods).",
                       enum=["Scaled", "NodeLost", "PartialAdmission"]),
        "since": _time("When it began."),
    }),
    "activeReplicas": _int("Pods running now."),
    "readyReplicas": _int("Pods ready now."),
    "restarts": _int("Gang restarts so far."),
    "attempt": _int("Workloads created so far, minus one: a gang restart and a rebuild after an edit each "
                    "start a new attempt (its workload is named <name>-r<attempt>)."),
    "workloadActive": _bool("A workload exists and is not suspended: the fields that shape it are immutable "
                            "until it is suspended or finished."),
    "queue": _obj("Where a queue (Kueue) holds the workload.", {
        "name": _str("The LocalQueue (the kueue.x-k8s.io/queue-name label)."),
        "workload": _str("Kueue's Workload object for this attempt."),
        "admitted": _bool("Whether Kueue has admitted it."),
        "message": _str("Kueue's own words on why it waits, or why it was preempted."),
    }),
    "progress": _str("epoch/totalEpochs, for kubectl get."),
    "epoch": _int("Last finished epoch (rank 0)."),
    "totalEpochs": _int("Epochs of the run."),
    "trainLoss": _num("Training loss of the last epoch."),
    "evalAccuracy": _num("Eval accuracy of the last epoch (0..1)."),
    "imagesPerSecond": _num("Training throughput of the last epoch."),
    "elapsedSeconds": _num("Seconds trained so far."),
    "etaSeconds": _num("Estimated seconds left."),
    "lastProgressTime": _time("When progress was read."),
    "summary": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                "description": "The trainer's final summary (its termination message)."},
    "startTime": _time("When the first attempt started."),
    "completionTime": _time("When it finished."),
    "pendingSince": _time("When the current wait for pods began (cleared once they all run)."),
    "disruptions": _int("Of the restarts, those the cluster caused (evicted, preempted, node lost): they do "
                        "not count against spec.maxRestarts."),
    "step": _int("Optimizer steps taken so far (rank 0)."),
    "stepsTotal": _int("Optimizer steps of the whole run."),
    "resumeStep": _int("The step the current attempt resumed at (0: from the start)."),
    "resumeSkippedCheckpoints": _int("Step checkpoints newer than where the current run resumed that it "
                                     "could not use (another world size or steps per epoch); a "
                                     "CheckpointSkipped Event says so."),
    "dataset": _obj("What the trainer made of the data before its first step: the counts of its dataset "
                    "report (dataset.json in the output lists the classes and the skipped files).", {
        "layout": _str("synthetic, flat, oxford or imagefolder (from the final summary)."),
        "images": _int("Images found and readable."),
        "classes": _int("Classes among them."),
        "skipped": _int("Files left out: not images, unlabelled or unreadable."),
        "trainImages": _int("Images in the training split."),
        "evalImages": _int("Images in the evaluation split."),
    }),
    "lastFailure": _obj("The failure that ended the last attempt, classified.", {
        "cause": _str("PermanentError, ExitCode, OOMKilled, Evicted, Preempted, NodeLost, Stopped "
                      "(the trainer saved a step checkpoint on SIGTERM and exited 75: not counted) or "
                      "Deleted (a rank's pod was deleted before its end could be read: not counted)."),
        "pod": _str("The pod whose failure ended the attempt (the first to fail)."),
        "rank": _int("Its machine rank."),
        "node": _str("The node it ran on."),
        "exitCode": _int("The trainer container's exit code."),
        "message": _str("The trainer's own reason, or the cluster's."),
        "logTail": _str("The last lines of that container's log."),
        "lastStep": _int("The step that attempt had reached: its final summary's, else as last read."),
        "lostSteps": _int("Steps it had done past the point the next attempt resumed at, so done again (at "
                          "least, where its step is as last read)."),
        "time": _time("When it failed."),
    }),
    "deadline": _obj("Bookkeeping of spec.activeDeadlineSeconds: the time that does not count.", {
        "pausedSeconds": _num("Seconds Suspended, Queued or Preempted since the start, closed pauses only."),
        "pausedSince": _time("When the current pause began."),
    }),
    "goodput": _obj("Where the wall time went and the share of it that was training kept (docs/operator.md, "
                    "Preemption and goodput). Made again when a phase or an attempt's parts change.", {
        totals.RATIO: _num("productiveSeconds / wallSeconds."),
        totals.WALL: _seconds("From the creation to the completion, or to asOf."),
        totals.WAITING: _seconds("Pending, Queued, Suspended, Preempted and Restarting, but for a resize."),
        totals.RESIZING: _seconds("Those phases while a resize drained the gang and started the next "
                                  "at its new size (status.resize): the drain and the restart."),
        totals.STARTUP: _seconds("The attempts' start-up: the trainer's start to its first step's end."),
        totals.PRODUCTIVE: _seconds("The attempts' training time, less lostSeconds."),
        totals.INPUT_WAIT: _seconds("The share of the attempts' training time their training loop waited "
                                    "for its next batch: the input pipeline holding the steps back."),
        totals.LOST: _seconds("Training time of steps done again after a restart."),
        totals.EVAL: _seconds("The attempts' evaluation."),
        totals.CHECKPOINT: _seconds("The attempts' checkpoint saves (the training loop blocked)."),
        totals.RESTORE: _seconds("The attempts' checkpoint restores."),
        totals.UNACCOUNTED: _seconds("wallSeconds less every other part: imports before the trainer's "
                                     "clock, pod ends, an attempt's time after its last read."),
        "asOf": _time("When the totals were made."),
        "phaseSince": _time("When the current phase began (bookkeeping)."),
        "bookedWaitingSeconds": _seconds("Waiting in phases already left (bookkeeping)."),
        "bookedResizingSeconds": _seconds("Resizing in phases already left (bookkeeping)."),
        "attempts": {"type": "array", "maxItems": 10, "description": "Each run's parts (an attempt, or the "
                     "part of one between a Kueue preemption or a suspension and the next), from rank 0's "
                     "gauges as last read or its final summary (the newest ten).",
                     "items": _obj("One run.", {
                         "attempt": _int("status.attempt of that attempt."),
                         "worldSize": _int("Its machines (pods): status.replicas while it ran."),
                         "startedAt": _time("When its rank 0 container started."),
                         "startupSeconds": _seconds("Its start-up."),
                         "trainSeconds": _seconds("Its training time (lost steps included)."),
                         "inputWaitSeconds": _seconds("The share of it spent waiting for the next batch."),
                         "evalSeconds": _seconds("Its evaluation."),
                         "checkpointSeconds": _seconds("Its checkpoint saves."),
                         "restoreSeconds": _seconds("Its restore."),
                         "firstStep": _int("The step it resumed at."),
                         "lastStep": _int("The step it reached: its final summary's, else as last read."),
                         "lostSteps": _int("Its steps done again by the next run (at least, where its "
                                           "lastStep is as last read)."),
                         "lostSeconds": _seconds("Their time, at its seconds per step."),
                     })},
        "earlier": _obj("The parts of runs older than the newest ten, added up.", {
            key: _seconds("Added up.") for key in ("startupSeconds", "trainSeconds", "inputWaitSeconds",
                                                   "evalSeconds", "checkpointSeconds", "restoreSeconds",
                                                   "lostSeconds")}),
    }),
    "tracking": _obj("The run in the trackers (spec.tracking), from rank 0's summary at an attempt's end and "
                     "its gauge while it runs; the TrackingDegraded condition says when a server failed.", {
        "mlflowRunId": _str("The MLflow run's id: every attempt of the training logs to this one run."),
        "mlflowUrl": _str("The run's page on the MLflow server."),
        "ok": _bool("false: an MLflow server was down, slow or refusing; the training went on without it."),
        "warning": _str("The trainer's one line on that failure (URLs redacted)."),
    }),
    "lastCheckpoint": _obj("The newest checkpoint a restart would resume from (with a claim output).", {
        "epoch": _int("Whole epochs in the newest epoch checkpoint."),
        "step": _int("Global step of the newest checkpoint, an epoch's or a step checkpoint "
                     "(spec.checkpoint.intervalSeconds)."),
        "time": _time("When the operator saw it."),
    }),
    "output": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
               "description": "The output the operator chose for a training without spec.output (same "
                              "shape as spec.output), chosen once and kept."},
    "outputReason": _str("Why status.output: the operator's default, or why it fell back to an emptyDir."),
    "children": _obj("Objects the operator created.", {
        "outputClaim": _str("Name of the output PersistentVolumeClaim the operator made."),
        "job": _str("Name of the Job."),
        "service": _str("Name of the headless Service."),
        "pytorchJob": _str("Name of the PyTorchJob."),
        "networkPolicy": _str("Name of the NetworkPolicy around the training's pods."),
    }),
})
