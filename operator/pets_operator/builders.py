"""Pure builders: a resolved PetsTraining spec -> the manifests the operator creates.

Nothing here talks to the API server. Inputs are the typed spec (`Spec`, from `api.resolve_spec`),
outputs are plain dicts ready for `kopf.adopt` and the Kubernetes API. The pod contract these
manifests implement is docs/contract.md.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pets_contract import env as contract_env
from pets_contract import names
from pets_operator import api, pods, tracking
from pets_operator.spec import Spec, snake

CONTAINER = names.TRAINER_CONTAINERS[0]  # "trainer"
PORT_NAME = "rendezvous"
TERMINATION_LOG = "/dev/termination-log"
# The pods' uid and gid (pets_contract.names.RUN_AS, the images' user): non-root and above any host
# user's (checkov's CKV_K8S_40 asks for >= 10000; hosts give users 1000-60000), distroless's "nonroot".
RUN_AS = names.RUN_AS
# The trainer image's HOME (image/Dockerfile).
HOME = "/home/pets"
# The root filesystem is read-only; these are where the trainer writes besides /output, /dev/shm and
# the termination log (found by tracing a 2-process training: docs/operator.md, "Security checks").
# /tmp: Python's tempfile, the launcher's exit-code file, torchrun's log directories, multiprocessing's
# forkserver sockets, torch's /tmp/torchinductor_<user>. HOME: the caches under ~/.cache and ~/.config
# (matplotlib's; the Hugging Face hub's and torch's for pretrained weights from the hub; triton's and
# CUDA's on GPUs).
SCRATCH_DIRS = {"tmp": "/tmp", "home": HOME}


@dataclass(frozen=True)
class NetworkPolicySettings:
    """The operator-wide side of spec.networkPolicy (the chart's trainingNetworkPolicy values)."""

    enabled: bool = True
    # NetworkPolicyPeers allowed to the trainers' progress port besides the pods of the training: the
    # chart puts the operator's own pods first. None at all: that port is open to every source (an
    # operator run outside the cluster, `pets-operator run` on a laptop, reads it from a node address).
    metrics_from: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class Target:
    """Where and what: the PetsTraining's identity and the operator-wide settings."""

    name: str
    namespace: str
    attempt: int = 0
    default_image: str = api.DEFAULT_IMAGE
    cluster_domain: str = api.DEFAULT_CLUSTER_DOMAIN
    # The training's own labels that its workload carries too (Kueue's queue and priority class).
    queue_labels: Mapping[str, str] = field(default_factory=dict)
    # What is left of spec.activeDeadlineSeconds for this attempt (status.plan's bookkeeping; None: all
    # of it, as for a first attempt or `pets-operator render`).
    deadline_left: int | None = None
    network_policy: NetworkPolicySettings = field(default_factory=NetworkPolicySettings)
    # The digest of the spec asked for, where the workload is built at another size (resize.next_size):
    # None: that of the spec it is built from.
    spec_digest: str | None = None
    # status.checkpointDir (checkpoint_home.py); None: checkpoint_dir(spec), as for `render`.
    checkpoint_dir: str | None = None
    # status.globalBatch: the trainer's --global-batch-size (None: its own default, as for `render`).
    global_batch: int | None = None
    uid: str = ""  # the PetsTraining's (an MLflow run's tag; "" where unknown, as in `render`)

    @property
    def queued(self) -> bool:
        """A queue decides when the workload runs: it is created suspended and Kueue unsuspends it."""
        return api.KUEUE_QUEUE_LABEL in self.queue_labels


def queue_labels(training_labels: Mapping[str, str] | None) -> dict[str, str]:
    """The PetsTraining's labels that pass on to its workload."""
    return {k: v for k, v in (training_labels or {}).items() if k in api.KUEUE_LABELS}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


# Defaulted spec fields added after workloads began to carry the digest: left out of it while they hold
# their defaults, so an operator upgrade does not take every running workload for an edited one.
ADDED_LATER = ["placement", "checkpoint", "networkPolicy", "elastic", "tracking"]


# Fields whose stored default this release dropped: 0.1.0 fills an unset one with its default and
# digests that, so an unset one is digested as that value here too, and after a `helm rollback` 0.1.0
# takes this release's workload for the one it would build rather than for an edited one.
DEFAULT_BEFORE = {"mixedPrecision": "fp16"}


def spec_digest(spec: Spec | Mapping[str, Any]) -> str:
    """What the workload is built from: the spec without the fields only the operator reads. A workload
    whose annotation differs was built from an older spec (edited while it was suspended or queued).
    A mapping is the spec as the API stores it (one from before a field existed, say)."""
    props = api.SPEC_SCHEMA["properties"]
    stored = {**DEFAULT_BEFORE, **(spec.to_dict() if isinstance(spec, Spec) else spec)}
    return _digest({k: v for k, v in stored.items() if k not in api.MUTABLE_WHILE_RUNNING
                    and not (k in ADDED_LATER and v == api.apply_defaults(props[k], props[k]["default"]))})


# The spec fields that shape a checkpoint's state (the trainer's own check is saves._fingerprint). Not
# the world size: a step checkpoint holds the global position in the epoch, so a run resumes from it
# at any size (a resize).
CHECKPOINT_SHAPE = ["model", "freezeBackbone", "imageSize", "batchSize", "epochs", "learningRate", "seed",
                    "dataset", "processesPerReplica"]
# The shape of operators up to 0.1.0, world size included: the directory of a training they made, kept
# across an upgrade (checkpoint_home.py).
CHECKPOINT_SHAPE_0_1 = [*CHECKPOINT_SHAPE[:-1], "replicas", "processesPerReplica"]


def checkpoint_shape(spec: Spec, shape: list[str] = CHECKPOINT_SHAPE) -> str:
    return _digest({k: spec.to_dict().get(k) for k in shape})


def checkpoint_dir(spec: Spec, shape: list[str] = CHECKPOINT_SHAPE) -> str:
    """One checkpoint directory per shape: a restart or a resize resumes where the shape allows, and an
    edit that changes the shape (epochs 5 -> 9) starts afresh instead of refusing the old checkpoint."""
    return f"{api.OUTPUT_DIR}/checkpoints/{checkpoint_shape(spec, shape)}"


# The machines the workload's pods were built for (PETS_NUM_MACHINES): a queue that admits fewer pods
# (Kueue's partial admission) changes the workload's count, not the pods' world size (resize.py).
ANNOTATION_WORLD_SIZE = f"{api.GROUP}/world-size"


def job_name(name: str, attempt: int) -> str:
    """The workload of one attempt: `<name>` first, `<name>-r<N>` after the Nth restart."""
    return name if attempt == 0 else f"{name}-r{attempt}"


def service_name(name: str) -> str:
    return name


def labels(name: str, component: str) -> dict[str, str]:
    return {
        api.LABEL_NAME: "pets-training",
        api.LABEL_INSTANCE: name,
        api.LABEL_COMPONENT: component,
        api.LABEL_MANAGED_BY: api.MANAGED_BY,
        api.LABEL_PART_OF: "pets-training",
        api.LABEL_TRAINING: name,
    }


def metadata(target: Target, name: str, component: str) -> dict[str, Any]:
    """Metadata of a child of the training: its name, its namespace and the training's labels."""
    return {"name": name, "namespace": target.namespace, "labels": labels(target.name, component)}


def selector(name: str) -> dict[str, str]:
    return {api.LABEL_TRAINING: name, api.LABEL_COMPONENT: "trainer"}


def dataset_cache_name(spec: Spec) -> str:
    """The cache claim of spec.dataset.url: one per source (url, digest, endpoint), shared by every
    training in the namespace that reads it."""
    dataset = spec.dataset
    endpoint = (dataset.get("s3") or {}).get("endpoint") or ""
    key = "\n".join([dataset["url"], dataset.get("sha256") or "", endpoint])
    return api.DATASET_CACHE_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:12]


def dataset_init_container(spec: Spec, trainer: dict[str, Any]) -> dict[str, Any]:
    """The init container that fetches spec.dataset.url into the cache claim (pets_training.dataset_init),
    with the trainer's image, resources and hardening; the S3 keys come from the Secret, to it alone."""
    dataset = spec.dataset
    s3 = dataset.get("s3") or {}
    args = ["--url", dataset["url"], "--cache", api.DATASET_CACHE_DIR, "--summary-path", TERMINATION_LOG,
            "--layout", dataset.get("layout", "auto"),
            # the claim's requested size: the initializer never writes past it (a provisioner may not hold it)
            "--cache-size", str((dataset.get("cache") or {}).get("size") or api.DEFAULT_DATASET_CACHE_SIZE)]
    if dataset.get("sha256"):
        args += ["--sha256", dataset["sha256"]]
    for flag, key in (("--s3-endpoint", "endpoint"), ("--s3-region", "region"),
                      ("--credentials-secret", "credentialsSecret")):
        if s3.get(key):
            args += [flag, s3[key]]
    container: dict[str, Any] = {
        "name": pods.DATASET_INIT,
        "image": trainer["image"],
        "imagePullPolicy": trainer["imagePullPolicy"],
        "command": ["pets-dataset-init"],
        "args": args,
        "resources": copy.deepcopy(trainer["resources"]),
        "volumeMounts": [{"name": "data", "mountPath": api.DATASET_CACHE_DIR},
                         {"name": "tmp", "mountPath": "/tmp"}],
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": copy.deepcopy(trainer["securityContext"]),
    }
    if s3.get("credentialsSecret"):
        container["env"] = [{"name": key, "valueFrom": {"secretKeyRef": {"name": s3["credentialsSecret"],
                                                                         "key": key}}}
                            for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")]
    return container


def main_address(target: Target) -> str:
    """Stable DNS name of rank 0: `<job>-0.<service>.<namespace>.svc.<domain>`."""
    job = job_name(target.name, target.attempt)
    return f"{job}-0.{service_name(target.name)}.{target.namespace}.svc.{target.cluster_domain}"


def trainer_args(spec: Spec, checkpoints: str | None = None, global_batch: int | None = None) -> list[str]:
    """Trainer flags (`pets-train --help`) for a resolved spec (`checkpoints`: the training's checkpoint
    directory, where status.checkpointDir names one)."""
    args = [
        "--epochs", str(spec.epochs),
        "--batch-size", str(spec.batch_size),
        "--lr", repr(float(spec.learning_rate)),
        "--mixed-precision", spec.mixed_precision or "auto",
        "--seed", str(spec.seed),
        "--model", spec.model,
        "--image-size", str(spec.image_size),
        "--output-dir", api.OUTPUT_DIR,
        "--checkpoint-dir", checkpoints or checkpoint_dir(spec),
        "--checkpoint-interval-seconds", str(spec.checkpoint["intervalSeconds"]),
    ]
    # Explicit either way: the trainer's own default (pretrained, as in the tutorial) must not decide.
    args.append("--pretrained" if spec.pretrained else "--no-pretrained")
    if spec.weights:
        args += ["--weights", spec.weights]
    if spec.pretrained_cache:
        args += ["--pretrained-cache", _in_claim(api.PRETRAINED_CACHE_DIR, spec.pretrained_cache)]
    if not spec.freeze_backbone:
        args.append("--unfreeze")
    source = spec.dataset_source
    if source == "synthetic":
        synthetic = spec.dataset["synthetic"]
        args += [
            "--data", "synthetic",
            "--synthetic-images-per-class", str(synthetic["imagesPerClass"]),
            "--synthetic-classes", str(synthetic["numClasses"]),
        ]
    else:
        data = api.DATA_DIR if source in ("hostPath", "url") else _in_claim(api.DATA_DIR, spec.dataset)
        args += ["--data", data, "--data-layout", spec.dataset.get("layout", "auto")]
    args += ["--summary-path", TERMINATION_LOG, "--metrics-port", str(api.METRICS_PORT)]
    if global_batch is not None:  # kept at every size of a resize (checkpoint_home.global_batch)
        args += ["--global-batch-size", str(global_batch)]
    return args + tracking.trainer_args(spec)


def _in_claim(mount_path: str, source: Mapping[str, Any]) -> str:
    """Where the folder ``source.persistentVolumeClaim.path`` names is, with the claim at ``mount_path``."""
    sub = source["persistentVolumeClaim"].get("path", "/").strip("/")
    return f"{mount_path}/{sub}" if sub else mount_path


def _volumes(spec: Spec, training: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []

    def add(name: str, source: dict[str, Any], path: str, **mount: Any) -> None:
        volumes.append({"name": name, **source})
        mounts.append({"name": name, "mountPath": path, **mount})

    add("dshm", {"emptyDir": {"medium": "Memory"}}, "/dev/shm")
    for name, path in SCRATCH_DIRS.items():
        add(name, {"emptyDir": {}}, path)
    output = api.output_of(spec)
    if claim_name := output_claim(spec, training):  # the user's claim may name a folder in it
        sub = (output.get("persistentVolumeClaim") or {}).get("path", "/").strip("/")
        add("output", {"persistentVolumeClaim": {"claimName": claim_name}}, api.OUTPUT_DIR,
            **({"subPath": sub} if sub else {}))
    else:
        add("output", {"emptyDir": dict(output.get("emptyDir") or {})}, api.OUTPUT_DIR)
    if spec.pretrained_cache:
        cache = {"claimName": spec.pretrained_cache["persistentVolumeClaim"]["claimName"], "readOnly": True}
        add("pretrained-cache", {"persistentVolumeClaim": cache}, api.PRETRAINED_CACHE_DIR, readOnly=True)
    source = spec.dataset_source
    if source == "persistentVolumeClaim":
        claim = spec.dataset["persistentVolumeClaim"]
        add("data", {"persistentVolumeClaim": {"claimName": claim["claimName"], "readOnly": True}},
            api.DATA_DIR, readOnly=True)
    elif source == "url":  # the cache claim: the init container fills data/, the trainer reads it
        add("data", {"persistentVolumeClaim": {"claimName": dataset_cache_name(spec)}}, api.DATA_DIR,
            readOnly=True, subPath="data")
    elif source == "hostPath":
        add("data", {"hostPath": {"path": spec.dataset["hostPath"]["path"], "type": "Directory"}},
            api.DATA_DIR, readOnly=True)
    return volumes, mounts


def _resources(spec: Spec) -> dict[str, Any]:
    res = spec.resources
    amounts: dict[str, Any] = {"cpu": str(res["cpu"]), "memory": str(res["memory"])}
    if res["gpu"] > 0:
        amounts[res["gpuResourceName"]] = str(res["gpu"])
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _env(spec: Spec, target: Target, *, container_name: str,
         headless_service: bool) -> list[dict[str, Any]]:
    """The pod contract's environment (docs/contract.md): where this pod sits in the gang, nothing else.

    The recipe (mixed precision, output directory...) travels as trainer flags, see `trainer_args`.
    """
    env: list[dict[str, Any]] = [
        {"name": contract_env.NUM_MACHINES, "value": str(spec.replicas)},
        {"name": contract_env.PROCS_PER_MACHINE, "value": str(spec.processes_per_replica)},
        {"name": contract_env.MAIN_PORT, "value": str(spec.master_port)},
        # The attempt (docs/contract.md): the trainer's checkpoint fencing token, so a pod of an older
        # attempt (a partitioned node's) cannot publish a checkpoint over a newer attempt's.
        {"name": contract_env.ATTEMPT, "value": str(target.attempt)},
        {"name": contract_env.CPU_LIMIT, "valueFrom": {"resourceFieldRef": {
            "containerName": container_name, "resource": "limits.cpu", "divisor": "1"}}},
    ]
    if headless_service:
        # Without our headless Service (a controller that names the main pod itself), the controller
        # sets MASTER_ADDR, which the launcher falls back to.
        env.insert(2, {"name": contract_env.MAIN_ADDR, "value": main_address(target)})
    if spec.resources["gpu"] > 0:  # the trainer fails, saying why, rather than train on the CPU without them
        env.append({"name": contract_env.GPUS, "value": str(spec.resources["gpu"])})
    env += tracking.trainer_env(spec, target.namespace, target.name, target.uid)
    # User extras cannot shadow the contract: api's env-not-reserved rule refuses them (server and local).
    env += [dict(extra) for extra in spec.env or []]
    return env


def pod_template(spec: Spec, target: Target, *, container_name: str = CONTAINER,
                 port_name: str = PORT_NAME, headless_service: bool = True) -> dict[str, Any]:
    """The trainer pod, the same for every backend. A backend whose controller looks for its own
    container and port names passes them; `headless_service` puts the pod behind our Service."""
    volumes, mounts = _volumes(spec, target.name)
    container: dict[str, Any] = {
        "name": container_name,
        "image": spec.image or target.default_image,
        "imagePullPolicy": spec.image_pull_policy,
        "args": trainer_args(spec, target.checkpoint_dir, target.global_batch),
        "env": _env(spec, target, container_name=container_name, headless_service=headless_service),
        "ports": [
            {"name": port_name, "containerPort": spec.master_port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": api.METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": _resources(spec),
        "volumeMounts": mounts,
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
        },
    }
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if spec.dataset_source == "url":
        pod["initContainers"] = [dataset_init_container(spec, container)]
    # SIGTERM: every rank finishes its step, saves and exits 75 (the trainer's exits.STOPPED).
    pod["terminationGracePeriodSeconds"] = spec.checkpoint["gracePeriodSeconds"]
    if headless_service:
        pod["subdomain"] = service_name(target.name)
    for key in ("nodeSelector", "affinity", "priorityClassName", "serviceAccountName", "imagePullSecrets"):
        if value := getattr(spec, snake(key)):
            pod[key] = value
    pod["tolerations"] = tolerations(spec)
    meta_labels = labels(target.name, "trainer") | {api.LABEL_ATTEMPT: str(target.attempt)}
    if spec.placement["spreadAcrossNodes"]:
        pod["topologySpreadConstraints"] = [spread_across_nodes(target)]
    return {
        "metadata": {
            "labels": meta_labels,
            "annotations": {api.ANNOTATION_ATTEMPT: str(target.attempt)},
        },
        "spec": pod,
    }


# The taints the node controller puts on a node it stops hearing from (Ready Unknown) or that reports
# NotReady; the taint manager evicts pods without a matching NoExecute toleration at once, and the
# DefaultTolerationSeconds admission plugin gives pods that have none a toleration of 300 s.
NODE_LOST_TAINTS = ["node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"]


def tolerations(spec: Spec) -> list[dict[str, Any]]:
    """spec.tolerations, then a NoExecute toleration of spec.placement.nodeLostSeconds for each taint of
    a lost node that the user's own tolerations do not already cover (theirs win)."""
    own = [dict(t) for t in spec.tolerations or []]

    def covered(key: str) -> bool:
        return any(t.get("effect") in (None, "", "NoExecute")
                   and (t.get("key") == key or (not t.get("key") and t.get("operator") == "Exists"))
                   for t in own)

    seconds = spec.placement["nodeLostSeconds"]
    return own + [{"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
                  for key in NODE_LOST_TAINTS if not covered(key)]


def spread_across_nodes(target: Target) -> dict[str, Any]:
    """At most one pod more on any node than on another, counting only this attempt's trainer pods (an
    older attempt's pods that linger do not skew it), on nodes that are schedulable for them: a tainted
    node (cordoned, or lost: node.kubernetes.io/unreachable) is not a domain to balance against."""
    return {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": selector(target.name) | {api.LABEL_ATTEMPT: str(target.attempt)}},
        "nodeTaintsPolicy": "Honor",
        "nodeAffinityPolicy": "Honor",
    }


def workload_metadata(spec: Spec, target: Target) -> dict[str, Any]:
    """Metadata of one attempt's workload, whatever its kind."""
    return {
        "name": job_name(target.name, target.attempt),
        "namespace": target.namespace,
        "labels": labels(target.name, "training-job") | dict(target.queue_labels),
        "annotations": {api.ANNOTATION_ATTEMPT: str(target.attempt),
                        api.ANNOTATION_SPEC_DIGEST: target.spec_digest or spec_digest(spec),
                        ANNOTATION_WORLD_SIZE: str(spec.replicas)},
    }


def attempt_deadline(spec: Spec, target: Target) -> int | None:
    """The workload's own activeDeadlineSeconds: what is left of the training's (a backstop; the operator
    ends the training itself when it runs out)."""
    if not spec.active_deadline_seconds:
        return None
    return target.deadline_left if target.deadline_left is not None else int(spec.active_deadline_seconds)


def created_suspended(spec: Spec, target: Target) -> bool:
    return bool(spec.suspend) or target.queued


def output_claim_name(name: str) -> str:
    """The claim spec.output.managedClaim makes for the training `name`."""
    return f"{name}{api.OUTPUT_CLAIM_SUFFIX}"


def output_claim(spec: Spec, name: str) -> str | None:
    """The claim the training `name` writes its output to (made by the operator or the user's), or None
    for an emptyDir."""
    output = api.output_of(spec)
    if "managedClaim" in output:
        return output_claim_name(name)
    return (output.get("persistentVolumeClaim") or {}).get("claimName")


def gang_access_modes(spec: Spec) -> list[str]:
    """A claim every pod of the training mounts: ReadWriteMany when there are several, or may be after a
    resize (they may run on several nodes), else ReadWriteOnce. docs/operator.md ("Output") says why."""
    most = max(spec.replicas, int((spec.elastic or {}).get("maxReplicas") or 1))
    return ["ReadWriteMany"] if most > 1 else ["ReadWriteOnce"]


