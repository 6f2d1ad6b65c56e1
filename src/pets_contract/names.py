"""The names the operator, the client and the trainer's pods agree on: the API, the phases, the labels
and annotations of a training's children, the output directory's files, the pods' user."""

from __future__ import annotations

from pets_contract import __version__

GROUP = "training.pets.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PetsTraining"
PLURAL = "petstrainings"
SINGULAR = "petstraining"
SHORT_NAMES = ["pt"]
CRD_NAME = f"{PLURAL}.{GROUP}"
DEFAULT_IMAGE = f"pets-training/trainer:{__version__}"

# status.phase
PENDING = "Pending"
RUNNING = "Running"
RESTARTING = "Restarting"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
SUSPENDED = "Suspended"
QUEUED = "Queued"  # a queue (Kueue) holds the workload: not admitted yet
PREEMPTED = "Preempted"  # the queue took the admission back; it resumes from its checkpoint when re-admitted
PHASES = [PENDING, QUEUED, RUNNING, RESTARTING, PREEMPTED, SUSPENDED, SUCCEEDED, FAILED]
FINISHED_PHASES = [SUCCEEDED, FAILED]

# Labels on every child.
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_TRAINING = f"{GROUP}/training"
MANAGED_BY = "pets-operator"
CLIENT_MANAGED_BY = "pets-client"  # on the client's helper pods and the claims upload makes
APP_NAME = "pets-training"  # app.kubernetes.io/name of the client's helper pods and claims
# On a claim of spec.output.managedClaim: its retentionPolicy (Delete or Retain), so retained claims are
# found with `kubectl get pvc -l training.pets.dev/output-retention=Retain`.
LABEL_OUTPUT_RETENTION = f"{GROUP}/output-retention"
LABEL_DATASET_CACHE = f"{GROUP}/dataset-cache"  # on spec.dataset.url's cache claim: shared, not owned
ANNOTATION_DATASET_URL = f"{GROUP}/dataset-url"
ANNOTATION_ATTEMPT = f"{GROUP}/attempt"
# On the trainer pods: the attempt they belong to, so a selector (spec.placement's spread) can pick
# exactly one attempt's pods whatever the backend.
LABEL_ATTEMPT = f"{GROUP}/attempt"
# On the workload: a digest of the spec it was built from, so an edit made while it was suspended
# (or queued) is noticed and the workload rebuilt from the current spec.
ANNOTATION_SPEC_DIGEST = f"{GROUP}/spec-digest"

# Pod labels of each backend's workload (the Job controller's and the Kubeflow training-operator's).
JOB_NAME_LABEL = "job-name"
JOB_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
KUBEFLOW_JOB_NAME_LABEL = "training.kubeflow.org/job-name"
KUBEFLOW_REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
KUBEFLOW_REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
TRAINER_CONTAINERS = ("trainer", "pytorch")  # the trainer container's name per backend

# The user and group every pod of ours runs as: the images' `pets` user, so the trainer's files on a
# claim are readable and writable by the fetch and upload helpers.
RUN_AS = 65532

# A training's output directory in its pods, and what the trainer writes there (docs/trainer.md).
OUTPUT_DIR = "/output"
OUTPUT_CLAIM_SUFFIX = "-output"  # spec.output.managedClaim's claim: <training>-output
SUMMARY_FILE = "summary.json"
PROGRESS_FILE = "progress.jsonl"
PLOT_FILE = "metrics.png"
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.yaml"
DATASET_REPORT_FILE = "dataset.json"
TENSORBOARD_DIR = "tensorboard"  # rank 0's TensorBoard event files, <output>/tensorboard/
MLFLOW_RUN_FILE = "mlflow-run.json"  # the MLflow run this training logs to: a restart continues it
OUTPUT_FILES = (SUMMARY_FILE, PROGRESS_FILE, PLOT_FILE, MODEL_FILE, CONFIG_FILE, DATASET_REPORT_FILE)

METRICS_PORT = 9090  # the trainer's progress endpoint on rank 0
