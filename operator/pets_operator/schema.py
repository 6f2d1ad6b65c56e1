"""The PetsTraining's OpenAPI schema: the spec, with its defaults and its rules' CEL, and the admission
policy that keeps a running training's shape (the status: status_schema)."""

from __future__ import annotations

from typing import Any

from pets_contract.env import DEFAULT_MAIN_PORT
from pets_contract.names import GROUP, OUTPUT_CLAIM_SUFFIX, PLURAL
from pets_operator import k8s_schema
from pets_operator.defaults import (
    ABS_PATH,
    DEFAULT_CHECKPOINT_INTERVAL,
    DEFAULT_DATASET_CACHE_SIZE,
    DEFAULT_GRACE_PERIOD,
    DEFAULT_OUTPUT_CLAIM_SIZE,
    DNS_SUBDOMAIN,
    ENV_NAME,
    IMAGE,
)
from pets_operator.rules import _validations

# ----------------------------------------------------------------------------- schema helpers


def _set(**fields: Any) -> dict[str, Any]:
    """The fields of a schema node that are set (a schema leaves out what it does not restrict)."""
    return {key: value for key, value in fields.items() if value is not None}


def _int(description: str, *, default: int | None = None, minimum: int | None = None,
         maximum: int | None = None) -> dict[str, Any]:
    return {"type": "integer", "description": description} | _set(default=default, minimum=minimum,
                                                                  maximum=maximum)


def _str(description: str, *, default: str | None = None, pattern: str | None = None,
         max_length: int | None = None, min_length: int | None = None,
         enum: list[str] | None = None) -> dict[str, Any]:
    return {"type": "string", "description": description} | _set(
        default=default, enum=enum, pattern=pattern, minLength=min_length, maxLength=max_length)


def _bool(description: str, default: bool | None = None) -> dict[str, Any]:
    return {"type": "boolean", "description": description} | _set(default=default)


def _object_name(description: str) -> dict[str, Any]:
    """The name of a Kubernetes object (a claim, a Secret, a StorageClass): a DNS subdomain."""
    return _str(description, pattern=DNS_SUBDOMAIN, min_length=1, max_length=253)


def _seconds(description: str) -> dict[str, Any]:
    return {"type": "number", "description": f"{description} Seconds."}


def _obj(description: str, properties: dict[str, Any], *, required: list[str] | None = None,
         default: dict[str, Any] | None = None, rules: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"type": "object", "description": description, "properties": properties} | _set(
        required=required or None, default=default, **{"x-kubernetes-validations": rules or None})


def _quantity(description: str, default: str | None = None) -> dict[str, Any]:
    """An int-or-string quantity; its value is checked by a `_quantity_rule` on the parent object."""
    return k8s_schema.int_or_string(description) | _set(default=default)


def _k8s(model: str, field_name: str, description: str, **extra: Any) -> dict[str, Any]:
    """A pod field with the real Kubernetes schema (generated from the client's model metadata, see
    `k8s_schema`), our description, and extra bounds (maxItems...) on top."""
    return k8s_schema.field(model, field_name, description) | extra


def _tolerations() -> dict[str, Any]:
    out = _k8s("V1PodSpec", "tolerations", "Tolerations of the pods (core/v1 Toleration).", maxItems=32)
    props = out["items"]["properties"]
    props["key"]["maxLength"] = 316
    props["value"]["maxLength"] = 63
    return out


def _image_pull_secrets() -> dict[str, Any]:
    out = _k8s("V1PodSpec", "imagePullSecrets", "Secrets to pull the trainer image with (core/v1 "
               "LocalObjectReference).", maxItems=16)
    out["items"]["properties"]["name"].update(pattern=DNS_SUBDOMAIN, minLength=1, maxLength=253)
    out["items"]["required"] = ["name"]
    return out


def _node_selector() -> dict[str, Any]:
    out = _k8s("V1PodSpec", "nodeSelector", "Node labels the pods must match.")
    out["additionalProperties"]["maxLength"] = 63
    return out


def _env() -> dict[str, Any]:
    out = _k8s("V1Container", "env",
               "Extra environment variables of the trainer container (core/v1 EnvVar: value or "
               "valueFrom). Names match `" + ENV_NAME + "`; names starting with PETS_ and the rank "
               "variables belong to the pod contract.", maxItems=64)
    item = out["items"]
    item["properties"]["name"].update(pattern=ENV_NAME, minLength=1, maxLength=128)
    item["properties"]["value"]["maxLength"] = 32768
    item["x-kubernetes-validations"] = _validations("spec.env[]")
    return out


def _claim(description: str, path: str = "Directory inside the volume (absolute, as mounted at its root).",
           read_only: bool = True) -> dict[str, Any]:
    """A claim to mount: its name, the directory in it, and (`read_only`) whether it is mounted read-only."""
    properties = {"claimName": _object_name("Name of the PersistentVolumeClaim in the training's namespace."),
                  "path": _str(path, default="/", pattern=ABS_PATH, max_length=1024)}
    if read_only:
        properties["readOnly"] = _bool("Mount the claim read-only.", False)
    return _obj(description, properties, required=["claimName"])


def _made_claim(default_size: str) -> dict[str, Any]:
    """The size and StorageClass of a claim the operator makes (children._claim reads them)."""
    return {"size": _quantity(f"Storage requested; unset: {default_size}."),
            "storageClassName": _object_name("StorageClass of the claim; unset: the cluster's default.")}


# ----------------------------------------------------------------------------- the spec

SPEC_SCHEMA: dict[str, Any] = _obj(
    "What to train and where. Every field but replicas, maxRestarts, ttlSecondsAfterFinished, scheduling "
    "and suspend is immutable while the training's workload runs (status.workloadActive) and spec.suspend "
    "is false: suspend it (in the same write or before), edit it, and resume it, and the workload is "
    "rebuilt from the edited spec. replicas may change while it runs (a resize, within spec.elastic).",
    {
        "replicas": _int(
            "Number of machines (pods) in the gang: the size asked for (status.replicas is the size it runs "
            "at). May change while it runs (kubectl scale pt NAME --replicas N), within spec.elastic: the "
            "operator stops the gang with the SIGTERM step checkpoint and starts the next attempt at the "
            "new size, which resumes from that checkpoint (docs/operator.md, \"Resizing a training\").",
            default=1, minimum=1, maximum=128),
        "processesPerReplica": _int(
            "Accelerate processes per pod (one per GPU on GPU nodes). Immutable while running.",
            default=1, minimum=1, maximum=16),
        "epochs": _int("Training epochs. Immutable while running.", default=5, minimum=1, maximum=1000),
        "batchSize": _int("Batch size per process. Immutable while running.",
                          default=64, minimum=1, maximum=4096),
        "learningRate": {
            "type": "number", "description": "Peak learning rate of OneCycleLR. Immutable while running.",
            "default": 0.03, "exclusiveMinimum": True, "minimum": 0, "maximum": 10,
        },
        "mixedPrecision": _str(
            "Mixed precision: auto, no, fp16 or bf16. auto (unset means auto) picks bf16 on a GPU of compute "
            "capability 8.0 or more (A100, H100: no GradScaler, so no read-back each step), fp16 on an "
            "older GPU (with a fused Adam), and on CPU bf16 where the CPU has bf16 instructions, else no. "
            "fp16 on CPU becomes bf16, or no where the CPU lacks bf16 instructions. The trainer logs what "
            "it picked. Immutable while running.",
            # no default stored: a training made by this release then still runs under the release
            # before it after a `helm rollback`, whose operator refuses auto and defaults to fp16
            enum=["auto", "no", "fp16", "bf16"]),
        "seed": _int("Random seed (split, init, augmentation). Immutable while running.",
                     default=42, minimum=0, maximum=2**31 - 1),
        "model": _str("timm model name. Immutable while running.", default="resnet50d",
                      pattern=r"^[a-z0-9][a-z0-9_.]*$", max_length=100),
        "pretrained": _bool(
            "Start from the model's ImageNet weights, as the tutorial does. They come from one source: "
            "the Hugging Face hub (needs internet; a cluster without it fails at once, saying so), "
            "pretrainedCache (a hub cache on a volume) or weights (one file). false: random init, "
            "which needs neither. Immutable while running.", True),
        "weights": _str(
            "Absolute path, inside the pod, of one local weights file (safetensors) for air-gapped "
            "clusters; mount it with the dataset or output volume. Immutable while running.",
            pattern=ABS_PATH, max_length=1024),
        "pretrainedCache": _obj(
            "A Hugging Face hub cache on a volume, mounted read-only and used with the hub offline, so "
            "pretrained: true loads the same files it would download (fill it once: docs/trainer.md). "
            "Immutable while running.",
            {
                "persistentVolumeClaim": _claim("The claim holding the cache.", (
                    "The cache directory inside the volume (the hub's HF_HUB_CACHE, which holds "
                    "models--timm--...)."), read_only=False),
            },
            required=["persistentVolumeClaim"]),
        "freezeBackbone": _bool(
            "Train only the classifier head (the tutorial's recipe); false fine-tunes every layer. "
            "Immutable while running.", True),
        "imageSize": _int("Input image size in pixels. Immutable while running.",
                          default=224, minimum=32, maximum=1024),
        "dataset": _obj(
            "Exactly one source of images: synthetic, persistentVolumeClaim, hostPath or url. Immutable "
            "while running.",
            {
                "synthetic": _obj(
                    "The built-in deterministic synthetic pets set, generated in the pod (offline).",
                    {
                        "imagesPerClass": _int("Images generated per class.", default=20,
                                               minimum=2, maximum=10000),
                        "numClasses": _int("Number of classes.", default=37, minimum=2, maximum=1000),
                    }),
                "persistentVolumeClaim": _claim(
                    "A PersistentVolumeClaim holding the images (mounted read-only at /data); see layout."),
                "layout": _str(
                    "How the directory names the classes: flat (<label>_<n>.jpg files, the tutorial's), "
                    "oxford (the Oxford-IIIT Pet archive unpacked: images/<Breed>_<n>.jpg), imagefolder "
                    "(a folder per class), or auto (unset): detected. Not for synthetic.",
                    enum=["auto", "flat", "oxford", "imagefolder"]),
                "url": _str(
                    "Where to fetch the images from: an http(s) archive (.tar, .tar.gz, .tgz or .zip; "
                    "give its sha256) or an S3 prefix, s3://bucket/prefix (see s3). An init container "
                    "of each pod fetches it once into a cache claim, pets-dataset-<hash of the url and "
                    "digest>, that outlives the training, so the next training on the same data "
                    "downloads nothing; the trainer reads it read-only. A source that cannot be "
                    "reached, a wrong sha256, refused credentials or an archive without images fail "
                    "the training at once (exit 78, no restart), naming the field.",
                    pattern=r"^(https?|s3)://[^\s]+$", max_length=2048),
                "sha256": _str("The sha256 of the archive at url (64 lower-case hex digits).",
                               pattern=r"^[0-9a-f]{64}$"),
                "s3": _obj("Where an s3:// url is served, and with which credentials.", {
                    "endpoint": _str("The S3 endpoint, http(s)://host[:port]; unset: AWS.",
                                     pattern=r"^https?://[^\s]+$", max_length=1024),
                    "region": _str("The bucket's region; unset: us-east-1.", pattern=r"^[a-z0-9-]+$",
                                   max_length=64),
                    "credentialsSecret": _object_name(
                        "A Secret in the training's namespace with the keys AWS_ACCESS_KEY_ID and "
                        "AWS_SECRET_ACCESS_KEY, given to the init container only; unset: none (a public "
                        "bucket)."),
                }),
                "cache": _obj("The claim url's data is kept in (made by the operator when missing).",
                              _made_claim(DEFAULT_DATASET_CACHE_SIZE),
                              rules=_validations("spec.dataset.cache")),
                "hostPath": _obj(
                    "A directory of <label>_<n>.jpg images on every node (single-node or test clusters).",
                    {"path": _str("Absolute directory on the node.", pattern=ABS_PATH, min_length=1,
                                  max_length=1024)},
                    required=["path"]),
            },
            default={"synthetic": {}},
            rules=_validations("spec.dataset")),
        "output": _obj(
            "Where the trainer writes progress, checkpoints and the final model (mounted at /output). "
            "Unset: the operator's default, a managedClaim on the cluster's default StorageClass "
            "(recorded in status.output; an emptyDir where the cluster has no default StorageClass or "
            "the chart turns it off, said by the OutputDurable condition). With a claim a restart "
            "resumes from the newest checkpoint; with emptyDir it starts from scratch. Immutable while "
            "running.",
            {
                "managedClaim": _obj(
                    f"A PersistentVolumeClaim the operator makes for this training before its pods, "
                    f"named <training>{OUTPUT_CLAIM_SUFFIX}: checkpoints and results outlive the pods, so "
                    "a restart resumes and `kubectl pets fetch` works. An existing claim of that name is "
                    "used as it is (a Retain claim of an earlier training of the same name: its work "
                    "resumes).",
                    {
                        **_made_claim(DEFAULT_OUTPUT_CLAIM_SIZE),
                        "accessModes": {
                            "type": "array", "maxItems": 2,
                            "description": "Access modes of the claim; unset: ReadWriteMany when replicas "
                                           "or elastic.maxReplicas > 1 (every pod mounts it, on any node), "
                                           "else ReadWriteOnce.",
                            "items": _str("An access mode.", enum=["ReadWriteOnce", "ReadWriteMany"]),
                        },
                        "retentionPolicy": _str(
                            "What deleting the training does to the claim: Delete (it goes with the "
                            "training, through its owner reference) or Retain (it stays, and keeps the "
                            "work).",
                            default="Delete", enum=["Delete", "Retain"]),
                    },
                    rules=_validations("spec.output.managedClaim")),
                "persistentVolumeClaim": _claim("A PersistentVolumeClaim (ReadWriteMany for replicas > 1)."),
                "emptyDir": _obj("A scratch volume that lives as long as the pod.",
                                 {"sizeLimit": _quantity("Size limit of the emptyDir.")},
                                 rules=_validations("spec.output.emptyDir")),
            },
            rules=_validations("spec.output")),
        "image": _str("Trainer image; the operator's --default-image when unset. Immutable while running.",
                      pattern=IMAGE, min_length=1, max_length=512),
        "imagePullPolicy": _str("Pull policy of the trainer image.", default="IfNotPresent",
                                enum=["Always", "IfNotPresent", "Never"]),
        "imagePullSecrets": _image_pull_secrets(),
        "resources": _obj(
            "Per-pod resources. Requests equal limits (Guaranteed QoS); the CPU limit also sizes the "
            "trainer's threads.",
            {
                # Sized so a default training schedules on a small (2-CPU) node: the default recipe
                # (resnet50d, 224 px, batch 64) peaked at 1.26 GiB RSS in one process on CPU
                # (docs/operator.md); the rest is room for DataLoader workers and page cache.
                "cpu": _quantity("CPU of each pod (request = limit).", default="1"),
                "memory": _quantity("Memory of each pod (request = limit).", default="3Gi"),
                "gpu": _int("GPUs of each pod; 0 trains on CPU. A pod that finds fewer working GPUs (a "
                            "node driver older than the trainer image's CUDA 13 needs, 580 or later; no "
                            "device from the device plugin) fails without restarts, naming what it found.",
                            default=0, minimum=0, maximum=16),
                "gpuResourceName": _str("Extended resource name of the GPUs.", default="nvidia.com/gpu",
                                        pattern=r"^([a-z0-9.-]+/)?[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$",
                                        max_length=253),
            },
            default={},
            rules=_validations("spec.resources")),
        "nodeSelector": _node_selector(),
        "tolerations": _tolerations(),
        "affinity": _k8s("V1PodSpec", "affinity", "Affinity of the pods (core/v1 Affinity)."),
        "placement": _obj(
            "How the gang's pods sit on nodes, and how soon a lost node's pods are replaced "
            "(docs/operator.md, \"Nodes lost and spreading across nodes\"). Immutable while running.",
            {
                "spreadAcrossNodes": _bool(
                    "Spread the gang's pods over nodes: a topology spread constraint on "
                    "kubernetes.io/hostname (maxSkew 1, DoNotSchedule) over this attempt's pods, which "
                    "honours node taints and affinity, so a cordoned or lost node is no place to "
                    "balance against. With at least as many schedulable nodes as replicas, one pod per "
                    "node.", False),
                "nodeLostSeconds": _int(
                    "Seconds a trainer pod stays bound to a node that the node controller marked "
                    "unreachable or not ready before it is evicted (NoExecute tolerations for "
                    "node.kubernetes.io/unreachable and node.kubernetes.io/not-ready; Kubernetes' "
                    "default is 300). The operator then force-deletes the pod and restarts the gang "
                    "from its newest checkpoint, not counted against maxRestarts. A toleration of "
                    "those keys in spec.tolerations wins.", default=30, minimum=0, maximum=3600),
            },
            default={}),
        "elastic": _obj(
            "Bounds of the training's size (docs/operator.md, \"Resizing a training\"). Immutable while "
            "running.",
            {
                "minReplicas": _int(
                    "The smallest size spec.replicas may be set to, and the smallest the operator may run "
                    "the training at when the cluster is short of room for all of spec.replicas (a node "
                    "lost and the gang not placed again within placement.nodeLostSeconds; a Kueue queue "
                    "with quota for fewer pods). Unset: spec.replicas (it never runs smaller than asked).",
                    minimum=1, maximum=128),
                "maxReplicas": _int(
                    "The largest size spec.replicas may be set to. Unset: 128. Above 1, the operator's "
                    "managed output claim is ReadWriteMany even for one replica, so the gang can grow "
                    "onto other nodes.", minimum=1, maximum=128),
            },
            default={},
            rules=_validations("spec.elastic")),
        "checkpoint": _obj(
            "When the trainer saves mid-epoch, so a preemption costs seconds rather than the epoch "
            "(docs/operator.md, \"Preemption and goodput\"). Immutable while running.",
            {
                "intervalSeconds": _int(
                    "Save a step checkpoint once this many seconds passed since the last save (0: "
                    "epoch checkpoints only). A resnet50d save blocked training 0.13-0.18 s on a 2-core "
                    "CPU node with a local volume: every 60 s that is 0.3 % of the time, and under 5 % "
                    "on a volume ten times slower; a node lost without notice loses at most this.",
                    default=DEFAULT_CHECKPOINT_INTERVAL, minimum=0, maximum=86400),
                "gracePeriodSeconds": _int(
                    "The pods' terminationGracePeriodSeconds: on SIGTERM (eviction, preemption, a "
                    "drain) every rank finishes its step, saves a step checkpoint and exits, which must "
                    "fit in it. Measured on CPU: a resnet50d step about 5 s, its save 0.2 s, the "
                    "launcher's exit 2 s; the default leaves four times that. Shorter than a step plus "
                    "a save: the kubelet kills the pods and the newest interval checkpoint is what "
                    "remains.", default=DEFAULT_GRACE_PERIOD, minimum=5, maximum=3600),
            },
            default={}),
        "priorityClassName": _str("PriorityClass of the pods.", pattern=DNS_SUBDOMAIN, max_length=253),
        "serviceAccountName": _str("ServiceAccount of the pods (the namespace's default when unset).",
                                   pattern=DNS_SUBDOMAIN, max_length=253),
        "env": _env(),
        "backend": _str("job: an Indexed Job and a headless Service; pytorchjob: a Kubeflow "
                        "PyTorchJob; auto: the operator's --auto-backend (job unless the chart's "
                        "autoBackend says pytorchjob) where it is served, else job. "
                        "Immutable while running.", default="auto", enum=["auto", "job", "pytorchjob"]),
        "networkPolicy": _bool(
            "A NetworkPolicy around the training's pods (made by the operator, owned by the training): "
            "they accept connections only from the pods of the same training (the rendezvous and the "
            "collectives' ports) and, on the progress port, from the operator and the peers the chart "
            "names (trainingNetworkPolicy.metricsFrom); egress stays open. false: none, where the "
            "platform manages policy itself. Immutable while running.", True),
        "masterPort": _int("Rendezvous port of the main process. Immutable while running.",
                           default=DEFAULT_MAIN_PORT, minimum=1024, maximum=65535),
        "maxRestarts": _int("Gang restarts after a failure before the training is Failed.",
                            default=3, minimum=0, maximum=100),
        "activeDeadlineSeconds": _int(
            "Seconds the training may run, counted from its start without the time it spent Suspended, "
            "Queued or Preempted (as in JobSet and Kubeflow's TrainJob). When they run out the training "
            "ends Failed (DeadlineExceeded), with no restart; each attempt's workload gets what is left.",
            minimum=1, maximum=2592000),
        "ttlSecondsAfterFinished": _int(
            "Delete the PetsTraining (and so every child) this many seconds after it finished.",
            minimum=0, maximum=31536000),
        "scheduling": _obj(
            "Bounds on waiting. Time spent Suspended (by the user or a queue) does not count.",
            {
                "pendingTimeoutSeconds": _int(
                    "Fail the training when its pods have not all started running this many seconds "
                    "after it began to wait (unschedulable, image pull errors, volumes...); the "
                    "failure names the reason it waited for. Unset: wait as long as it takes.",
                    minimum=1, maximum=2592000),
                "stallTimeoutSeconds": _int(
                    "Seconds without progress after which a Running training gets the Stalled "
                    "condition. Unset: 20 of its own steps, at least 2 minutes.",
                    minimum=10, maximum=2592000),
            }),
        "tracking": _obj(
            "Where rank 0 logs the run for the tools ML engineers use (docs/watching.md): TensorBoard event "
            "files on the output, and an MLflow run when a tracking server is named. A tracking server that "
            "is down, slow or refusing never fails or slows the training: the TrackingDegraded condition "
            "says so. Immutable while running.",
            {
                "tensorboard": _bool("Write TensorBoard event files under tensorboard/ in the output "
                                     "(`kubectl pets tensorboard NAME` serves them).", True),
                "mlflow": _obj(
                    "An MLflow tracking server to log the run to: the params, the per-epoch metrics, the "
                    "model and the summary as artifacts, the run's status at the end, and tags naming this "
                    "training. An attempt after a restart continues the same run; status.tracking names it.",
                    {
                        "uri": _str("The tracking server, http(s)://host[:port][/path], without credentials "
                                    "(credentialsSecret gives them). The training's NetworkPolicy leaves "
                                    "egress open, so the pods reach it.",
                                    pattern=r"^https?://[^\s]+$", max_length=1024),
                        "experiment": _str("The MLflow experiment of the run (made when missing).",
                                           default="pets-training", pattern=r"\S", max_length=256),
                        "credentialsSecret": _object_name(
                            "A Secret in the training's namespace whose keys MLFLOW_TRACKING_USERNAME and "
                            "MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN, become the trainer's "
                            "environment (each key optional: those the Secret has); they go nowhere else, "
                            "never to the status. Unset: none (a server without authentication)."),
                    },
                    required=["uri"],
                    rules=_validations("spec.tracking.mlflow")),
            },
            default={}),
        "suspend": _bool("Suspend the training: its workload is suspended and its pods removed; false "
                         "resumes it, rebuilt from the spec if that was edited meanwhile. In a Kueue "
                         "queue, this deactivates Kueue's Workload instead.", False),
    },
    default={},
    rules=_validations("spec"),
)

# Fields of spec the operator alone reads: they may change at any time. Every other field shapes
# the workload (its pods), so it cannot change while that workload runs.
MUTABLE_WHILE_RUNNING = ["maxRestarts", "ttlSecondsAfterFinished", "scheduling", "suspend"]
# Fields that shape the workload and still may change while it runs: the operator drains the workload
# with the SIGTERM save and builds the next attempt from the new value (a resize).
RESIZABLE_WHILE_RUNNING = ["replicas"]


def immutable_while_running() -> list[str]:
    return [key for key in SPEC_SCHEMA["properties"]
            if key not in MUTABLE_WHILE_RUNNING and key not in RESIZABLE_WHILE_RUNNING]


IMMUTABILITY_POLICY = f"{PLURAL}.{GROUP}-immutable-while-running"


def immutability_validations() -> list[dict[str, str]]:
    """The ValidatingAdmissionPolicy's validations (crd.immutability_policy): a field that shapes the
    workload cannot change while that workload runs, one validation per field so the refusal names it.

    Keyed on status.workloadActive (set by the operator: a workload exists and is not suspended), not
    on the phase: a Pending training whose Job already exists is running as far as an edit is concerned,
    while a Suspended or Queued one takes edits and is rebuilt from them on resume. An edit is taken as
    soon as spec.suspend is true (before, or in the same write): the operator then drains the workload
    with the SIGTERM save and builds the next from the edited spec on resume, so no edit waits for the
    seconds the workload takes to go.

    Not transition rules in the CRD: those sit at the object's root (they read the status) and the API
    server evaluates them on every status write too, which doubled a status patch's cost (13.0 against
    6.7 ms, docs/scale.md). The policy matches spec writes only (not the status subresource). Being
    admission CEL, `pets-operator render` does not check them: it has no old object to compare with."""
    running = ("has(oldObject.status) && has(oldObject.status.workloadActive) && "
               "oldObject.status.workloadActive && "
               "!(has(oldObject.spec.suspend) && oldObject.spec.suspend) && "
               "!(has(object.spec.suspend) && object.spec.suspend)")
    same = ("has(object.spec.{key}) == has(oldObject.spec.{key}) && "
            "(!has(object.spec.{key}) || object.spec.{key} == oldObject.spec.{key})")
    return [{
        "expression": f"!({running}) || ({same.format(key=key)})",
        "message": f"spec.{key} is immutable while the training's workload runs: set spec.suspend: "
                   f"true with the edit, or before it (the edit is applied on resume), or recreate the "
                   f"PetsTraining",
        "reason": "Invalid",
    } for key in immutable_while_running()]
