"""The environment of a training pod (docs/contract.md, "Environment of a training pod"): who sets each
name. The trainer reads them in one place, ``pets_training.contract``."""

from __future__ import annotations

# Set by the operator on the trainer container (MAIN_ADDR only with its headless Service: under a
# PyTorchJob the training-operator sets MASTER_ADDR instead).
NUM_MACHINES = "PETS_NUM_MACHINES"
PROCS_PER_MACHINE = "PETS_PROCS_PER_MACHINE"
MAIN_ADDR = "PETS_MAIN_ADDR"
MAIN_PORT = "PETS_MAIN_PORT"
CPU_LIMIT = "PETS_CPU_LIMIT"
ATTEMPT = "PETS_ATTEMPT"  # the checkpoint fence's token (pets_training.checkpoint.claim)
OPERATOR_ENV = (NUM_MACHINES, PROCS_PER_MACHINE, MAIN_ADDR, MAIN_PORT, CPU_LIMIT, ATTEMPT)
# Also set by the operator, only on a pod given GPUs (spec.resources.gpu > 0): how many. A trainer that
# finds fewer fails permanently instead of training on the CPU (pets_training.gpus).
GPUS = "PETS_GPUS"
OPERATOR_PREFIX = "PETS_"  # a user's spec.env may set no name of ours

# Set by the workload's controller: the Indexed Job controller (JOB_COMPLETION_INDEX) or Kubeflow's
# training-operator (the rest). The operator's own variables win where both say the same thing.
JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
CONTROLLER_ENV = (JOB_COMPLETION_INDEX, RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)

# Knobs of the image or the user, never set by the operator.
OUTPUT_DIR = "PETS_OUTPUT_DIR"  # the image sets /output, so a plain `docker run` writes there
RESOLVE_TIMEOUT = "PETS_RESOLVE_TIMEOUT"

# The training a pod belongs to, for the trackers' run tags (an MLflow run's namespace/name/uid). Read
# when present; a trainer outside the operator has none. Not in OPERATOR_ENV until the operator sets them.
TRAINING_NAMESPACE = "PETS_TRAINING_NAMESPACE"
TRAINING_NAME = "PETS_TRAINING_NAME"
TRAINING_UID = "PETS_TRAINING_UID"
TRAINING_ENV = (TRAINING_NAMESPACE, TRAINING_NAME, TRAINING_UID)

# Set per training process by torchrun (under `accelerate launch`) or notebook_launcher; accelerate's
# `--mixed_precision` arrives as ACCELERATE_MIXED_PRECISION.
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
ACCELERATE_MIXED_PRECISION = "ACCELERATE_MIXED_PRECISION"

# Set by `pets-launch` for the training processes it starts through `accelerate launch`: a file where a
# process that fails permanently appends its exit code, since torchrun exits 1 whatever its workers did.
EXIT_CODE_FILE = "PETS_EXIT_CODE_FILE"

# Set by the trainer's entry points (`pets-launch`, `python -m pets_training`) to the Unix time they
# started, kept by the processes they start: a run's start-up counts from it, imports included.
PROCESS_STARTED = "PETS_PROCESS_STARTED"

DEFAULT_MAIN_PORT = 29500  # torch.distributed's, and spec.masterPort's default
