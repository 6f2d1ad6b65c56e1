"""The PetsTraining API's defaults, where a training's volumes are mounted, the value patterns its
schema and rules share, and SpecError. The API's names are the contract's (pets_contract.names)."""

from __future__ import annotations

from pets_contract import env as contract_env
from pets_contract import quantity

DATASET_CACHE_PREFIX = "pets-dataset-"  # + a hash of spec.dataset.url and its digest (builders)
DATASET_CACHE_DIR = "/dataset-cache"  # where the dataset init container mounts the cache claim
DEFAULT_DATASET_CACHE_SIZE = "5Gi"
# spec.output.managedClaim: the claim the operator makes is named <training>-output (OUTPUT_CLAIM_SUFFIX),
# of this size unless the spec says otherwise (a resnet50d run keeps about 0.7 GB: two checkpoints and
# the model).
DEFAULT_OUTPUT_CLAIM_SIZE = "5Gi"
DEFAULT_CHECKPOINT_INTERVAL = 60  # spec.checkpoint.intervalSeconds (why: its description)
DEFAULT_GRACE_PERIOD = 30  # spec.checkpoint.gracePeriodSeconds (why: its description)
DEFAULT_STORAGE_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
DEFAULT_CLUSTER_DOMAIN = "cluster.local"
# The operator's own defaults (`pets-operator run --help`, the chart's `operator.*` values).
DEFAULT_WORKERS = 48  # concurrent reconciliations
DEFAULT_PROGRESS_INTERVAL = 10.0  # seconds between two reads of a running training's progress
DEFAULT_SCRAPE_CONCURRENCY = 64  # progress reads in flight at once
DEFAULT_SCRAPE_TIMEOUT = 2.0  # seconds for one progress read
DATA_DIR = "/data"
PRETRAINED_CACHE_DIR = "/pretrained-cache"  # where spec.pretrainedCache's claim is mounted, read-only
MAX_NAME_LENGTH = 52  # leaves room for "-<index>" pod hostnames and "-<hash>" pod names within 63

# Kueue: a PetsTraining labelled with a queue passes these labels to its workload and leaves the
# workload's suspend to Kueue (https://kueue.sigs.k8s.io/docs/tasks/run/jobs/).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
KUEUE_LABELS = [KUEUE_QUEUE_LABEL, KUEUE_PRIORITY_LABEL]


class SpecError(ValueError):
    """A PetsTraining spec the operator cannot act on. The message names the field and the value."""



DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ABS_PATH = r"^/.*$"
QUANTITY = quantity.PATTERN  # a storage quantity, as the CRD's rules and the dataset initializer read it
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
IMAGE = r"^[^\s]+$"
RESERVED_ENV = list(contract_env.CONTROLLER_ENV)  # and every name with our prefix (OPERATOR_PREFIX)

