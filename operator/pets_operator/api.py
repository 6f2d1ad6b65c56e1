"""The PetsTraining API: names, defaults, the OpenAPI schema and the cross-field rules, in one place.

This module is the single source of truth for the CRD: `pets_operator.crd` turns `SPEC_SCHEMA` and
`STATUS_SCHEMA` into the CustomResourceDefinition that the chart ships (a unit test checks the
committed file matches), and `resolve_spec` applies the very same defaults and validation locally
(for `pets-operator render`, which runs without an API server). Each cross-field rule is one `Rule`
in `RULES`: its CEL (the CRD's x-kubernetes-validations) and its Python twin sit side by side, and
the local error is the API server's error text for that rule.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pets_contract import env as contract_env
from pets_contract.names import (  # noqa: F401  (the API's names, read here as api.<NAME>)
    ACTIVE_PHASES,
    ANNOTATION_ATTEMPT,
    ANNOTATION_DATASET_URL,
    ANNOTATION_SPEC_DIGEST,
    API_VERSION,
    CRD_NAME,
    DEFAULT_IMAGE,
    FAILED,
    FINISHED_PHASES,
    GROUP,
    KIND,
    LABEL_ATTEMPT,
    LABEL_COMPONENT,
    LABEL_DATASET_CACHE,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_OUTPUT_RETENTION,
    LABEL_PART_OF,
    LABEL_TRAINING,
    MANAGED_BY,
    METRICS_PORT,
    OUTPUT_CLAIM_SUFFIX,
    OUTPUT_DIR,
    PENDING,
    PHASES,
    PLURAL,
    PREEMPTED,
    QUEUED,
    RESTARTING,
    RUNNING,
    SHORT_NAMES,
    SINGULAR,
    SUCCEEDED,
    SUSPENDED,
    VERSION,
)
from pets_operator import k8s_schema

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


# ----------------------------------------------------------------------------- schema helpers


def _int(description: str, *, default: int | None = None, minimum: int | None = None,
         maximum: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "integer", "description": description}
    if default is not None:
        out["default"] = default
    if minimum is not None:
        out["minimum"] = minimum
    if maximum is not None:
        out["maximum"] = maximum
    return out


def _str(description: str, *, default: str | None = None, pattern: str | None = None,
         max_length: int | None = None, min_length: int | None = None,
         enum: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "string", "description": description}
    if default is not None:
        out["default"] = default
    if enum is not None:
        out["enum"] = enum
    if pattern is not None:
        out["pattern"] = pattern
    if min_length is not None:
        out["minLength"] = min_length
    if max_length is not None:
        out["maxLength"] = max_length
    return out


def _bool(description: str, default: bool) -> dict[str, Any]:
    return {"type": "boolean", "description": description, "default": default}


def _seconds(description: str) -> dict[str, Any]:
    return {"type": "number", "description": f"{description} Seconds."}


def _obj(description: str, properties: dict[str, Any], *, required: list[str] | None = None,
         default: dict[str, Any] | None = None, rules: list[dict[str, str]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "description": description, "properties": properties}
    if required:
        out["required"] = required
    if default is not None:
        out["default"] = default
    if rules:
        out["x-kubernetes-validations"] = rules
    return out


DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ABS_PATH = r"^/.*$"
# A non-negative resource.Quantity (a number and an optional suffix: 3Gi, 512Mi, 1.5, 500m, 1e3), as
# resource.ParseQuantity reads it, slightly narrowed (no sign, no "1.", exponents of at most 2 digits),
# so every value it admits is one the Job accepts. No backslash: it also sits in a CEL string literal.
QUANTITY = r"^([0-9]+([.][0-9]+)?|[.][0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][-+]?[0-9]{1,2})?$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
IMAGE = r"^[^\s]+$"
RESERVED_ENV = list(contract_env.CONTROLLER_ENV)  # and every name with our prefix (OPERATOR_PREFIX)


# ----------------------------------------------------------------------------- cross-field rules
#
# Each rule is written once, here: the CEL the API server evaluates (generated into the CRD's
# x-kubernetes-validations) and the Python check `resolve_spec`/`check_name` run locally, with the
# message both give. The API server reports a failed rule as
#     <path>: Invalid value: "object": <message>
# where <path> is the path of the node the rule sits on (spec, spec.env[0]) followed by the rule's
# fieldPath; `Rule.error` builds exactly that text, so `pets-operator render` refuses a spec with the
# words `kubectl apply` would print. The immutable-while-running checks are admission CEL
# (`immutability_validations`): render has no old object to compare with.


def _has(value: dict[str, Any], key: str) -> bool:
    """CEL's has(self.key) on a defaulted value (nulls are pruned before defaulting, as the server does)."""
    return isinstance(value, dict) and value.get(key) is not None


def _re2(pattern: str) -> str:
    """A Go (RE2) pattern for Python's re: Go's `$` is the end of the text, Python's `$` also matches
    before a final newline, so a final `$` becomes `\\Z`."""
    return pattern.removesuffix("$") + r"\Z" if pattern.endswith("$") else pattern


def _matches(pattern: str, text: str) -> bool:
    """CEL's string.matches."""
    return re.search(_re2(pattern), text) is not None


@dataclass(frozen=True, eq=False)
class Rule:
    """One cross-field validation rule: its CEL, its Python twin and its message, side by side.

    at: where the rule sits: "" (the whole object), "spec", "spec.dataset", or "spec.env[]" (each
        item of spec.env). `self` in `cel` and the argument of `check` are the defaulted value there.
    check: the Python twin of `cel`: True when the value passes.
    field_path: CEL's fieldPath, relative to `at` (".masterPort"): the field the server's error names.
    example_spec, example_name: a spec (and metadata.name) that breaks this rule and no other; the
        unit and integration tests submit it to render and to the API server.
    """

    id: str
    at: str
    cel: str
    message: str
    check: Callable[[Any], bool]
    example_spec: dict[str, Any] = field(default_factory=dict)
    example_name: str = "example"
    field_path: str = ""

    def validation(self) -> dict[str, str]:
        """The x-kubernetes-validations entry of the CRD."""
        out = {"rule": self.cel, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out

    def error(self, path: str) -> str:
        """The API server's error text when the value at `path` (spec, spec.env[0]) fails the rule.

        Every rule sits on an object, so the server shows the value as "object".
        """
        return f'{(path + self.field_path).lstrip(".")}: Invalid value: "object": {self.message}'


NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DATASET_SOURCES = ["synthetic", "persistentVolumeClaim", "hostPath", "url"]
_OUTPUT_VOLUMES = ["managedClaim", "persistentVolumeClaim", "emptyDir"]


def _exactly_one(keys: list[str]) -> str:
    return "[" + ", ".join(f"has(self.{k})" for k in keys) + "].filter(x, x).size() == 1"


def _is_quantity(value: Any) -> bool:
    """Python twin of `_quantity_rule`'s CEL: a non-negative integer, or a string matching QUANTITY."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 0
    return isinstance(value, str) and _matches(QUANTITY, value)


def _quantity_rule(rule_id: str, at: str, key: str, example: dict[str, Any]) -> Rule:
    """A quantity field (int-or-string) must hold a valid, non-negative quantity. A rule on the parent
    object (not a schema pattern) so that the server and `render` refuse it with the same words."""
    path = f"{at}.{key}"
    return Rule(
        id=rule_id,
        at=at,
        cel=f"!has(self.{key}) || (type(self.{key}) == int ? self.{key} >= 0 : "
            f"string(self.{key}).matches('{QUANTITY}'))",
        message=f"{path} must be a non-negative quantity: a number with an optional suffix, such as "
                "3Gi, 512Mi, 1.5 or 500m",
        check=lambda obj: not _has(obj, key) or _is_quantity(obj[key]),
        example_spec=example,
        field_path=f".{key}",
    )


def _dig(value: Any, keys: tuple[str, ...]) -> Any:
    """The value below `keys`, or None where a level is missing (CEL's has() on each level)."""
    for key in keys:
        if not _has(value, key):
            return None
        value = value[key]
    return value


def _has_chain(keys: tuple[str, ...]) -> str:
    """CEL: every level of self.<keys> is set."""
    return " && ".join(f"has(self.{'.'.join(keys[:depth])})" for depth in range(1, len(keys) + 1))


def _has_no_parent_segment(path: str) -> bool:
    """Python twin of the CEL in `_no_parent_segment_rule`: no `..` segment in the path."""
    return "/../" not in f"/{path}/"


def _no_parent_segment_rule(rule_id: str, keys: tuple[str, ...], example: dict[str, Any]) -> Rule:
    """A volume path (spec.<keys>) must not climb out with `..`: Kubernetes refuses `..` in a pod's
    hostPath and volume sub-paths, so the pods could never be created. On spec, not the path's own
    object, so the schema of those objects stays as it is."""
    dotted = ".".join(keys)
    return Rule(
        id=rule_id,
        at="spec",
        cel=f"!({_has_chain(keys)}) || !('/' + self.{dotted} + '/').contains('/../')",
        message=f"spec.{dotted} must not have a '..' segment: it would climb out of the directory it "
                "names, and Kubernetes refuses '..' in a pod's volume paths, so the pods could not be "
                "created",
        check=lambda spec: _dig(spec, keys) is None or _has_no_parent_segment(_dig(spec, keys)),
        example_spec=example,
        field_path=f".{dotted}",
    )


# user[:password]@ before a URL's host (CEL and Python alike: RE2 and re agree on it)
_USERINFO_RE = "^[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#]*@"
_DATASET_CLAIM = ("dataset", "persistentVolumeClaim")
_OUTPUT_CLAIM = ("output", "persistentVolumeClaim")


def _as_directory(path: str) -> str:
    """A claim path with one trailing slash, so that /a and /a/ are the same folder and /ab is not in /a."""
    return path if path.endswith("/") else path + "/"


def _output_nests_with_dataset(spec: dict[str, Any]) -> bool:
    """Python twin of the CEL of rule output-not-in-dataset: the output and the dataset are the same
    claim and one folder is the other or inside it."""
    dataset, output = _dig(spec, _DATASET_CLAIM), _dig(spec, _OUTPUT_CLAIM)
    if dataset is None or output is None or dataset["claimName"] != output["claimName"]:
        return False
    dataset_dir = _as_directory(dataset.get("path") or "/")
    output_dir = _as_directory(output.get("path") or "/")
    return dataset_dir.startswith(output_dir) or output_dir.startswith(dataset_dir)


def _cel_claim_directory(keys: tuple[str, ...]) -> str:
    """CEL of `_as_directory` on the path of the claim at self.<keys> ("/" when unset)."""
    claim = "self." + ".".join(keys)
    path = f"(has({claim}.path) ? {claim}.path : '/')"
    return f"({path}.endsWith('/') ? {path} : {path} + '/')"


_DATASET_DIR_CEL = _cel_claim_directory(_DATASET_CLAIM)
_OUTPUT_DIR_CEL = _cel_claim_directory(_OUTPUT_CLAIM)


RULES: list[Rule] = [
    Rule(
        id="name",
        at="",
        cel=f"self.metadata.name.size() <= {MAX_NAME_LENGTH} && self.metadata.name.matches('{NAME_PATTERN}')",
        message=f"metadata.name must be a DNS label of at most {MAX_NAME_LENGTH} characters starting "
                "with a letter (it names the Job, the Service and the pods)",
        check=lambda obj: len(obj["metadata"]["name"]) <= MAX_NAME_LENGTH
        and _matches(NAME_PATTERN, obj["metadata"]["name"]),
        example_name="9lives",
        field_path=".metadata.name",
    ),
    Rule(
        id="dataset-exactly-one",
        at="spec.dataset",
        cel=_exactly_one(DATASET_SOURCES),
        message="spec.dataset must set exactly one of " + ", ".join(DATASET_SOURCES),
        check=lambda dataset: sum(_has(dataset, k) for k in DATASET_SOURCES) == 1,
        example_spec={"dataset": {"synthetic": {}, "hostPath": {"path": "/srv/pets"}}},
    ),
    Rule(
        id="output-exactly-one",
        at="spec.output",
        cel=_exactly_one(_OUTPUT_VOLUMES),
        message="spec.output must set exactly one of " + ", ".join(_OUTPUT_VOLUMES),
        check=lambda output: sum(_has(output, k) for k in _OUTPUT_VOLUMES) == 1,
        example_spec={"output": {"emptyDir": {}, "persistentVolumeClaim": {"claimName": "out"}}},
    ),
    Rule(
        id="env-not-reserved",
        at="spec.env[]",
        cel=f"!self.name.startsWith('{contract_env.OPERATOR_PREFIX}') && !(self.name in "
            + "[" + ", ".join(f"'{n}'" for n in RESERVED_ENV) + "])",
        message=f"spec.env[].name must not start with {contract_env.OPERATOR_PREFIX} or be one of "
                + ", ".join(RESERVED_ENV) + " (they belong to the pod contract)",
        check=lambda env: not env["name"].startswith(contract_env.OPERATOR_PREFIX) and \
            env["name"] not in RESERVED_ENV,
        example_spec={"env": [{"name": "OK", "value": "1"}, {"name": contract_env.MAIN_ADDR, "value": "x"}]},
        field_path=".name",
    ),
    # Pretrained weights come from one source: the hub (default), a hub cache volume, or one file.
    Rule(
        id="weights-need-pretrained",
        at="spec",
        cel="!(has(self.weights) && has(self.pretrained) && !self.pretrained)",
        message="spec.weights is a source of pretrained weights, and spec.pretrained is false: "
                "drop spec.weights, or set spec.pretrained: true",
        check=lambda spec: not (_has(spec, "weights") and _has(spec, "pretrained")
                                and not spec["pretrained"]),
        example_spec={"pretrained": False, "weights": "/w.safetensors"},
        field_path=".weights",
    ),
    Rule(
        id="pretrained-cache-needs-pretrained",
        at="spec",
        cel="!(has(self.pretrainedCache) && has(self.pretrained) && !self.pretrained)",
        message="spec.pretrainedCache is a source of pretrained weights, and spec.pretrained is false: "
                "drop spec.pretrainedCache, or set spec.pretrained: true",
        check=lambda spec: not (_has(spec, "pretrainedCache") and _has(spec, "pretrained")
                                and not spec["pretrained"]),
        example_spec={"pretrained": False,
                      "pretrainedCache": {"persistentVolumeClaim": {"claimName": "hub"}}},
        field_path=".pretrainedCache",
    ),
    Rule(
        id="one-weights-source",
        at="spec",
        cel="!(has(self.weights) && has(self.pretrainedCache))",
        message="spec.weights and spec.pretrainedCache are mutually exclusive: pick one source of "
                "pretrained weights",
        check=lambda spec: not (_has(spec, "weights") and _has(spec, "pretrainedCache")),
        example_spec={"weights": "/w.safetensors",
                      "pretrainedCache": {"persistentVolumeClaim": {"claimName": "hub"}}},
        field_path=".pretrainedCache",
    ),
    Rule(
        id="master-port-not-metrics-port",
        at="spec",
        cel=f"!has(self.masterPort) || self.masterPort != {METRICS_PORT}",
        message=f"spec.masterPort must not be {METRICS_PORT}, the trainer's metrics port",
        check=lambda spec: not _has(spec, "masterPort") or spec["masterPort"] != METRICS_PORT,
        example_spec={"masterPort": METRICS_PORT},
        field_path=".masterPort",
    ),
    Rule(
        id="processes-fit-gpus",
        at="spec",
        cel="!has(self.resources) || !has(self.resources.gpu) || self.resources.gpu == 0 || "
            "!has(self.processesPerReplica) || self.processesPerReplica <= self.resources.gpu",
        message="spec.processesPerReplica must not exceed spec.resources.gpu on GPU pods",
        check=lambda spec: not _has(spec, "resources") or not _has(spec["resources"], "gpu")
        or spec["resources"]["gpu"] == 0 or not _has(spec, "processesPerReplica")
        or spec["processesPerReplica"] <= spec["resources"]["gpu"],
        example_spec={"processesPerReplica": 4, "resources": {"gpu": 2}},
        field_path=".processesPerReplica",
    ),
    Rule(
        id="output-claim-writable",
        at="spec",
        cel="!has(self.output) || !has(self.output.persistentVolumeClaim) || "
            "!has(self.output.persistentVolumeClaim.readOnly) || "
            "!self.output.persistentVolumeClaim.readOnly",
        message="spec.output.persistentVolumeClaim.readOnly must be false: the trainer writes there",
        check=lambda spec: not _has(spec, "output") or not _has(spec["output"], "persistentVolumeClaim")
        or not _has(spec["output"]["persistentVolumeClaim"], "readOnly")
        or not spec["output"]["persistentVolumeClaim"]["readOnly"],
        example_spec={"output": {"persistentVolumeClaim": {"claimName": "out", "readOnly": True}}},
        field_path=".output.persistentVolumeClaim.readOnly",
    ),
    # The trainer writes checkpoints and the model into its output: inside the dataset's folder they
    # would be read back as images (and the dataset's own files overwritten).
    Rule(
        id="output-not-in-dataset",
        at="spec",
        cel=f"!({_has_chain(_DATASET_CLAIM)} && {_has_chain(_OUTPUT_CLAIM)} && "
            "self.dataset.persistentVolumeClaim.claimName == self.output.persistentVolumeClaim.claimName && "
            f"({_DATASET_DIR_CEL}.startsWith({_OUTPUT_DIR_CEL}) || "
            f"{_OUTPUT_DIR_CEL}.startsWith({_DATASET_DIR_CEL})))",
        message="spec.output.persistentVolumeClaim.path must not be spec.dataset.persistentVolumeClaim.path, "
                "nor inside it, nor hold it, when both name the same claim: the trainer would write its "
                "checkpoints into the folder it reads images from; use another claim, or folders side by "
                "side such as /images and /runs",
        check=lambda spec: not _output_nests_with_dataset(spec),
        example_spec={"dataset": {"persistentVolumeClaim": {"claimName": "pets"}},
                      "output": {"persistentVolumeClaim": {"claimName": "pets", "path": "/runs"}}},
        field_path=".output.persistentVolumeClaim.path",
    ),
    _no_parent_segment_rule("dataset-claim-path-no-parent", ("dataset", "persistentVolumeClaim", "path"),
                            {"dataset": {"persistentVolumeClaim": {"claimName": "pets",
                                                                   "path": "/images/../.."}}}),
    _no_parent_segment_rule("dataset-host-path-no-parent", ("dataset", "hostPath", "path"),
                            {"dataset": {"hostPath": {"path": "/srv/pets/../../etc"}}}),
    _no_parent_segment_rule("output-claim-path-no-parent", ("output", "persistentVolumeClaim", "path"),
                            {"output": {"persistentVolumeClaim": {"claimName": "out", "path": "/runs/.."}}}),
    _no_parent_segment_rule("pretrained-cache-path-no-parent",
                            ("pretrainedCache", "persistentVolumeClaim", "path"),
                            {"pretrainedCache": {"persistentVolumeClaim": {"claimName": "hub",
                                                                           "path": "/../hub"}}}),
    # spec.dataset.url's companions: the digest of an http(s) archive, where an s3:// URL is served, and
    # the cache claim of either.
    Rule(
        id="dataset-sha256-of-an-archive",
        at="spec.dataset",
        cel="!has(self.sha256) || (has(self.url) && !self.url.startsWith('s3://'))",
        message="spec.dataset.sha256 is the digest of the http(s) archive in spec.dataset.url: set that "
                "url, or drop sha256 (an s3:// prefix holds many objects, not one archive)",
        check=lambda dataset: not _has(dataset, "sha256") or (
            _has(dataset, "url") and not str(dataset["url"]).startswith("s3://")),
        example_spec={"dataset": {"url": "s3://bucket/pets", "sha256": "0" * 64}},
        field_path=".sha256",
    ),
    Rule(
        id="dataset-s3-needs-an-s3-url",
        at="spec.dataset",
        cel="!has(self.s3) || (has(self.url) && self.url.startsWith('s3://'))",
        message="spec.dataset.s3 says where an s3:// spec.dataset.url is served: set url to "
                "s3://bucket/prefix, or drop s3",
        check=lambda dataset: not _has(dataset, "s3") or (
            _has(dataset, "url") and str(dataset["url"]).startswith("s3://")),
        example_spec={"dataset": {"url": "https://example.com/pets.tar.gz",
                                  "s3": {"endpoint": "http://s3.example:7070"}}},
        field_path=".s3",
    ),
    # A password in a URL would ride in the pods' arguments and in every error that quotes the URL.
    Rule(
        id="dataset-url-no-credentials",
        at="spec.dataset",
        cel=f"!has(self.url) || !self.url.matches('{_USERINFO_RE}')",
        message="spec.dataset.url must not carry credentials (user:password@ before the host): put S3 keys "
                "in a Secret named by spec.dataset.s3.credentialsSecret, or serve the archive at a URL "
                "that needs none",
        check=lambda dataset: not _has(dataset, "url") or not re.search(_USERINFO_RE, dataset["url"]),
        example_spec={"dataset": {"url": "https://user:secret@example.com/pets.tar.gz"}},
        field_path=".url",
    ),
    Rule(
        id="dataset-s3-endpoint-no-credentials",
        at="spec.dataset",
        cel=f"!has(self.s3) || !has(self.s3.endpoint) || !self.s3.endpoint.matches('{_USERINFO_RE}')",
        message="spec.dataset.s3.endpoint must not carry credentials (user:password@ before the host): "
                "put the keys in a Secret named by spec.dataset.s3.credentialsSecret",
        check=lambda dataset: not _has(dataset, "s3") or not _has(dataset["s3"], "endpoint")
        or not re.search(_USERINFO_RE, dataset["s3"]["endpoint"]),
        example_spec={"dataset": {"url": "s3://bucket/pets", "s3": {"endpoint": "http://key:secret@s3:7070"}}},
        field_path=".s3.endpoint",
    ),
    Rule(
        id="dataset-cache-needs-a-url",
        at="spec.dataset",
        cel="!has(self.cache) || has(self.url)",
        message="spec.dataset.cache is the claim spec.dataset.url's data is kept in: set url, or drop cache",
        check=lambda dataset: not _has(dataset, "cache") or _has(dataset, "url"),
        example_spec={"dataset": {"synthetic": {}, "cache": {"size": "1Gi"}}},
        field_path=".cache",
    ),
    _quantity_rule("dataset-cache-size-quantity", "spec.dataset.cache", "size",
                   {"dataset": {"url": "https://example.com/pets.tar.gz", "cache": {"size": "lots"}}}),
    _quantity_rule("cpu-quantity", "spec.resources", "cpu", {"resources": {"cpu": "0.5.5"}}),
    _quantity_rule("memory-quantity", "spec.resources", "memory", {"resources": {"memory": "-4Gi"}}),
    _quantity_rule("size-limit-quantity", "spec.output.emptyDir", "sizeLimit",
                   {"output": {"emptyDir": {"sizeLimit": "-1Gi"}}}),
    _quantity_rule("output-claim-size-quantity", "spec.output.managedClaim", "size",
                   {"output": {"managedClaim": {"size": "5 Gi"}}}),
]


def rules_at(at: str) -> list[Rule]:
    return [r for r in RULES if r.at == at]


def _validations(at: str) -> list[dict[str, str]]:
    return [r.validation() for r in rules_at(at)]


def _quantity(description: str, default: str | None = None) -> dict[str, Any]:
    """An int-or-string quantity; its value is checked by a `_quantity_rule` on the parent object."""
    out = k8s_schema.int_or_string(description)
    if default is not None:
        out["default"] = default
    return out


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


def _claim(description: str) -> dict[str, Any]:
    return _obj(
        description,
        {
            "claimName": _str("Name of the PersistentVolumeClaim in the training's namespace.",
                              pattern=DNS_SUBDOMAIN, min_length=1, max_length=253),
            "path": _str("Directory inside the volume (absolute, as mounted at its root).",
                         default="/", pattern=ABS_PATH, max_length=1024),
            "readOnly": _bool("Mount the claim read-only.", False),
        },
        required=["claimName"],
    )


# ----------------------------------------------------------------------------- the spec

SPEC_SCHEMA: dict[str, Any] = _obj(
    "What to train and where. Every field but maxRestarts, ttlSecondsAfterFinished, scheduling and "
    "suspend is immutable while the training's workload runs (status.workloadActive) and spec.suspend "
    "is false: suspend it (in the same write or before), edit it, and resume it, and the workload is "
    "rebuilt from the edited spec.",
    {
        "replicas": _int("Number of machines (pods) in the gang. Immutable while running.",
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
            "Mixed precision: no, fp16 or bf16 (on CPU fp16 becomes bf16, or no where the CPU lacks bf16 "
            "instructions). Immutable while running.",
            default="fp16", enum=["no", "fp16", "bf16"]),
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
                "persistentVolumeClaim": _obj("The claim holding the cache.", {
                    "claimName": _str("Name of the PersistentVolumeClaim in the training's namespace.",
                                      pattern=DNS_SUBDOMAIN, min_length=1, max_length=253),
                    "path": _str("The cache directory inside the volume (the hub's HF_HUB_CACHE, which "
                                 "holds models--timm--...).", default="/", pattern=ABS_PATH,
                                 max_length=1024),
                }, required=["claimName"]),
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
                    "credentialsSecret": _str(
                        "A Secret in the training's namespace with the keys AWS_ACCESS_KEY_ID and "
                        "AWS_SECRET_ACCESS_KEY, given to the init container only; unset: none (a public "
                        "bucket).", pattern=DNS_SUBDOMAIN, min_length=1, max_length=253),
                }),
                "cache": _obj("The claim url's data is kept in (made by the operator when missing).", {
                    "size": _quantity(f"Storage requested; unset: {DEFAULT_DATASET_CACHE_SIZE}."),
                    "storageClassName": _str("StorageClass of the claim; unset: the cluster's default.",
                                             pattern=DNS_SUBDOMAIN, min_length=1, max_length=253),
                }, rules=_validations("spec.dataset.cache")),
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
                        "size": _quantity(f"Storage requested; unset: {DEFAULT_OUTPUT_CLAIM_SIZE}."),
                        "storageClassName": _str("StorageClass of the claim; unset: the cluster's default.",
                                                 pattern=DNS_SUBDOMAIN, min_length=1, max_length=253),
                        "accessModes": {
                            "type": "array", "maxItems": 2,
                            "description": "Access modes of the claim; unset: ReadWriteMany when replicas "
                                           "> 1 (every pod mounts it, on any node), else ReadWriteOnce.",
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
                "gpu": _int("GPUs of each pod; 0 trains on CPU.", default=0, minimum=0, maximum=16),
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
                           default=29500, minimum=1024, maximum=65535),
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


def immutable_while_running() -> list[str]:
    return [key for key in SPEC_SCHEMA["properties"] if key not in MUTABLE_WHILE_RUNNING]


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
    validations = []
    for key in immutable_while_running():
        same = (f"has(object.spec.{key}) == has(oldObject.spec.{key}) && "
                f"(!has(object.spec.{key}) || object.spec.{key} == oldObject.spec.{key})")
        validations.append({
            "expression": f"!({running}) || ({same})",
            "message": f"spec.{key} is immutable while the training's workload runs: set spec.suspend: "
                       f"true with the edit, or before it (the edit is applied on resume), or recreate the "
                       f"PetsTraining",
            "reason": "Invalid",
        })
    return validations


_CONDITION = _obj("A standard condition (metav1.Condition).", {
    "type": _str("Ready, Progressing, Succeeded, Failed or Suspended."),
    "status": _str("True, False or Unknown.", enum=["True", "False", "Unknown"]),
    "reason": _str("CamelCase reason."),
    "message": _str("Human readable message."),
    "lastTransitionTime": {"type": "string", "format": "date-time", "description": "When status changed."},
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
    "replicas": {"type": "integer", "description": "Pods of the gang."},
    "activeReplicas": {"type": "integer", "description": "Pods running now."},
    "readyReplicas": {"type": "integer", "description": "Pods ready now."},
    "restarts": {"type": "integer", "description": "Gang restarts so far."},
    "attempt": {"type": "integer",
                "description": "Workloads created so far, minus one: a gang restart and a rebuild after an "
                               "edit each start a new attempt (its workload is named <name>-r<attempt>)."},
    "workloadActive": {"type": "boolean",
                       "description": "A workload exists and is not suspended: the fields that shape it are "
                                      "immutable until it is suspended or finished."},
    "queue": _obj("Where a queue (Kueue) holds the workload.", {
        "name": _str("The LocalQueue (the kueue.x-k8s.io/queue-name label)."),
        "workload": _str("Kueue's Workload object for this attempt."),
        "admitted": {"type": "boolean", "description": "Whether Kueue has admitted it."},
        "message": _str("Kueue's own words on why it waits, or why it was preempted."),
    }),
    "progress": _str("epoch/totalEpochs, for kubectl get."),
    "epoch": {"type": "integer", "description": "Last finished epoch (rank 0)."},
    "totalEpochs": {"type": "integer", "description": "Epochs of the run."},
    "trainLoss": {"type": "number", "description": "Training loss of the last epoch."},
    "evalAccuracy": {"type": "number", "description": "Eval accuracy of the last epoch (0..1)."},
    "imagesPerSecond": {"type": "number", "description": "Training throughput of the last epoch."},
    "elapsedSeconds": {"type": "number", "description": "Seconds trained so far."},
    "etaSeconds": {"type": "number", "description": "Estimated seconds left."},
    "lastProgressTime": {"type": "string", "format": "date-time", "description": "When progress was read."},
    "summary": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                "description": "The trainer's final summary (its termination message)."},
    "startTime": {"type": "string", "format": "date-time", "description": "When the first attempt started."},
    "completionTime": {"type": "string", "format": "date-time", "description": "When it finished."},
    "pendingSince": {"type": "string", "format": "date-time",
                     "description": "When the current wait for pods began (cleared once they all run)."},
    "disruptions": {"type": "integer",
                    "description": "Of the restarts, those the cluster caused (evicted, preempted, node "
                                   "lost): they do not count against spec.maxRestarts."},
    "step": {"type": "integer", "description": "Optimizer steps taken so far (rank 0)."},
    "stepsTotal": {"type": "integer", "description": "Optimizer steps of the whole run."},
    "resumeStep": {"type": "integer", "description": "The step the current attempt resumed at (0: from "
                                                     "the start)."},
    "resumeSkippedCheckpoints": {"type": "integer", "description": "Step checkpoints newer than where the "
                                 "current run resumed that it could not use (another world size or steps "
                                 "per epoch); a CheckpointSkipped Event says so."},
    "dataset": _obj("What the trainer made of the data before its first step: the counts of its dataset "
                    "report (dataset.json in the output lists the classes and the skipped files).", {
        "layout": _str("synthetic, flat, oxford or imagefolder (from the final summary)."),
        "images": {"type": "integer", "description": "Images found and readable."},
        "classes": {"type": "integer", "description": "Classes among them."},
        "skipped": {"type": "integer", "description": "Files left out: not images, unlabelled or "
                                                      "unreadable."},
        "trainImages": {"type": "integer", "description": "Images in the training split."},
        "evalImages": {"type": "integer", "description": "Images in the evaluation split."},
    }),
    "lastFailure": _obj("The failure that ended the last attempt, classified.", {
        "cause": _str("PermanentError, ExitCode, OOMKilled, Evicted, Preempted, NodeLost or Stopped "
                      "(the trainer saved a step checkpoint on SIGTERM and exited 75: not counted)."),
        "pod": _str("The pod whose failure ended the attempt (the first to fail)."),
        "rank": {"type": "integer", "description": "Its machine rank."},
        "node": _str("The node it ran on."),
        "exitCode": {"type": "integer", "description": "The trainer container's exit code."},
        "message": _str("The trainer's own reason, or the cluster's."),
        "logTail": _str("The last lines of that container's log."),
        "lastStep": {"type": "integer", "description": "The step that attempt had reached, as last read."},
        "lostSteps": {"type": "integer", "description": "Steps it had done past the point the next attempt "
                                                        "resumed at, so done again (at least: its step is as "
                                                        "last read)."},
        "time": {"type": "string", "format": "date-time", "description": "When it failed."},
    }),
    "deadline": _obj("Bookkeeping of spec.activeDeadlineSeconds: the time that does not count.", {
        "pausedSeconds": {"type": "number", "description": "Seconds Suspended, Queued or Preempted since "
                                                            "the start, closed pauses only."},
        "pausedSince": {"type": "string", "format": "date-time", "description": "When the current pause "
                                                                                  "began."},
    }),
    "goodput": _obj("Where the wall time went and the share of it that was training kept (docs/operator.md, "
                    "Preemption and goodput). Made again when a phase or an attempt's parts change.", {
        "ratio": {"type": "number", "description": "productiveSeconds / wallSeconds."},
        "wallSeconds": _seconds("From the creation to the completion, or to asOf."),
        "waitingSeconds": _seconds("Pending, Queued, Suspended, Preempted and Restarting."),
        "startupSeconds": _seconds("The attempts' start-up: the trainer's start to its first step's end."),
        "productiveSeconds": _seconds("The attempts' training time, less lostSeconds."),
        "lostSeconds": _seconds("Training time of steps done again after a restart."),
        "evalSeconds": _seconds("The attempts' evaluation."),
        "checkpointSeconds": _seconds("The attempts' checkpoint saves (the training loop blocked)."),
        "restoreSeconds": _seconds("The attempts' checkpoint restores."),
        "unaccountedSeconds": _seconds("wallSeconds less every other part: imports before the trainer's "
                                       "clock, pod ends, an attempt's time after its last read."),
        "asOf": {"type": "string", "format": "date-time", "description": "When the totals were made."},
        "phaseSince": {"type": "string", "format": "date-time", "description": "When the current phase "
                                                                                 "began (bookkeeping)."},
        "bookedWaitingSeconds": _seconds("Waiting in phases already left (bookkeeping)."),
        "attempts": {"type": "array", "maxItems": 10, "description": "Each run's parts (an attempt, or the "
                     "part of one between a Kueue preemption or a suspension and the next), from rank 0's "
                     "gauges as last read or its final summary (the newest ten).",
                     "items": _obj("One run.", {
                         "attempt": {"type": "integer", "description": "status.attempt of that attempt."},
                         "startedAt": {"type": "string", "format": "date-time",
                                       "description": "When its rank 0 container started."},
                         "startupSeconds": _seconds("Its start-up."),
                         "trainSeconds": _seconds("Its training time (lost steps included)."),
                         "evalSeconds": _seconds("Its evaluation."),
                         "checkpointSeconds": _seconds("Its checkpoint saves."),
                         "restoreSeconds": _seconds("Its restore."),
                         "firstStep": {"type": "integer", "description": "The step it resumed at."},
                         "lastStep": {"type": "integer", "description": "The step it reached, as last read."},
                         "lostSteps": {"type": "integer", "description": "Its steps done again by the next "
                                                                        "run (at least: as last read)."},
                         "lostSeconds": _seconds("Their time, at its seconds per step."),
                     })},
        "earlier": _obj("The parts of runs older than the newest ten, added up.", {
            key: _seconds("Added up.") for key in ("startupSeconds", "trainSeconds", "evalSeconds",
                                                   "checkpointSeconds", "restoreSeconds", "lostSeconds")}),
    }),
    "lastCheckpoint": _obj("The newest checkpoint a restart would resume from (with a claim output).", {
        "epoch": {"type": "integer", "description": "Whole epochs in the newest epoch checkpoint."},
        "step": {"type": "integer", "description": "Global step of the newest checkpoint, an epoch's or a "
                                                   "step checkpoint (spec.checkpoint.intervalSeconds)."},
        "time": {"type": "string", "format": "date-time", "description": "When the operator saw it."},
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


def object_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the whole PetsTraining object."""
    return {
        "type": "object",
        "description": "Distributed fine-tuning of the Accelerate Pets recipe (timm resnet50d).",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            # name declared (the only field a CRD may restrict) so the name rule's fieldPath can point at it
            "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
            "spec": copy.deepcopy(SPEC_SCHEMA),
            "status": copy.deepcopy(STATUS_SCHEMA),
        },
        "required": ["spec"],
        "x-kubernetes-validations": _validations(""),
    }


# ----------------------------------------------------------------------------- local defaults/validation


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Fill in schema defaults the way the API server does (structural defaulting), recursively.

    As on the server, a null in a declared field (none of ours is nullable) is dropped first, and then
    defaulted like a missing one.
    """
    if not isinstance(value, dict) or schema.get("type") != "object":
        if isinstance(value, list) and "items" in schema:
            return [apply_defaults(schema["items"], item) for item in value]
        return value
    props = schema.get("properties", {})
    out = {k: v for k, v in value.items()
           if v is not None or (k not in props and not isinstance(schema.get("additionalProperties"), dict))}
    for key, sub in props.items():
        if key not in out and "default" in sub:
            out[key] = copy.deepcopy(sub["default"])
        if key in out:
            out[key] = apply_defaults(sub, out[key])
    return out


def _json_schema(schema: Any) -> Any:
    """The CRD schema as plain JSON Schema (draft 4): Kubernetes extensions dropped, patterns made to
    end where Go's do (`_re2`)."""
    if isinstance(schema, dict):
        out = {k: _json_schema(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
        if schema.get("type") == "object" and "properties" in schema and not schema.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            out["additionalProperties"] = False
        if isinstance(schema.get("pattern"), str):
            out["pattern"] = _re2(schema["pattern"])
        return out
    if isinstance(schema, list):
        return [_json_schema(v) for v in schema]
    return schema


@functools.cache
def _validator() -> Any:
    import jsonschema

    return jsonschema.Draft4Validator(_json_schema(SPEC_SCHEMA))


def _path(parts: Any) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")


def _nodes(value: Any, at: str, path: str = "") -> list[tuple[str, Any]]:
    """The values a rule sitting at `at` ("spec.dataset", "spec.env[]") sees, with their paths."""
    if not at:
        return [(path, value)]
    head, _, rest = at.partition(".")
    key, items = (head[:-2], True) if head.endswith("[]") else (head, False)
    child = value.get(key) if isinstance(value, dict) else None
    if child is None:
        return []  # absent: the server does not evaluate the rule either
    here = f"{path}.{key}".lstrip(".")
    if items:
        return [n for i, item in enumerate(child) for n in _nodes(item, rest, f"{here}[{i}]")]
    return _nodes(child, rest, here)


def check_rules(obj: dict[str, Any], rules: list[Rule] | None = None) -> None:
    """Run the Python twins of the CEL rules on a (defaulted, schema-valid) object.

    Raises SpecError with the API server's text for the first rule that fails.
    """
    for rule in RULES if rules is None else rules:
        for path, value in _nodes(obj, rule.at):
            if not rule.check(value):
                raise SpecError(rule.error(path))


def check_name(name: Any) -> str:
    """metadata.name checked by the rules on the whole object (render has no API server to ask).

    Those rules see only metadata.name here: a rule about the spec belongs at "spec".
    """
    if not isinstance(name, str) or not name:
        raise SpecError(f"metadata.name is required, got {name!r}")
    check_rules({"metadata": {"name": name}}, rules_at(""))
    return name


def default_output(kind: str = "managedClaim", size: str = DEFAULT_OUTPUT_CLAIM_SIZE,
                   storage_class: str = "") -> dict[str, Any]:
    """The output of a training without spec.output, from the operator's flags (the chart's
    defaultOutput values). Raises ValueError naming the flag and the value."""
    if kind == "emptyDir":
        return {"emptyDir": {}}
    if kind != "managedClaim":
        raise ValueError(f"--default-output must be managedClaim or emptyDir, got {kind!r}")
    if not re.match(QUANTITY, size):
        raise ValueError(f"--default-output-claim-size must be a Kubernetes quantity such as 5Gi, "
                         f"got {size!r}")
    if storage_class and not re.match(DNS_SUBDOMAIN, storage_class):
        raise ValueError(f"--default-output-storage-class must be a StorageClass name, got {storage_class!r}")
    claim = {"size": size, "retentionPolicy": "Delete"}
    return {"managedClaim": claim | ({"storageClassName": storage_class} if storage_class else {})}


# An unset spec.output: the operator's default (`pets-operator run --default-output`), chosen once per
# training and kept in status.output; this is that default where nothing else chose (render, builders).
DEFAULT_OUTPUT = default_output()


def output_of(spec: dict[str, Any]) -> dict[str, Any]:
    """spec.output, or (unset: the operator put none in) the default output."""
    return spec.get("output") or DEFAULT_OUTPUT


def resolve_spec(spec: Any) -> dict[str, Any]:
    """Defaulted and validated spec, as the API server would store it. Raises SpecError naming the field.

    The schema is checked with jsonschema, then the spec's cross-field rules (`RULES`) with their
    Python twins; a failed rule raises the same text the API server gives. Only the
    immutable-while-running checks are left to the server (the chart's admission policy).
    """
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise SpecError(f"spec must be a mapping, got {type(spec).__name__}: {spec!r}")
    resolved = apply_defaults(SPEC_SCHEMA, spec)
    errors = sorted(_validator().iter_errors(resolved), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        raise SpecError(f"{_path(['spec', *err.absolute_path])}: {err.message}")
    check_rules({"spec": resolved}, [r for r in RULES if r.at.split(".")[0] == "spec"])
    return resolved
