"""The cross-field rules of a PetsTraining, each written once: its CEL, its Python twin and its message."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pets_contract import env as contract_env
from pets_contract.names import METRICS_PORT
from pets_operator.defaults import MAX_NAME_LENGTH, QUANTITY, RESERVED_ENV

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


def _exactly_one_rule(rule_id: str, at: str, keys: list[str], example: dict[str, Any]) -> Rule:
    return Rule(
        id=rule_id,
        at=at,
        cel="[" + ", ".join(f"has(self.{k})" for k in keys) + "].filter(x, x).size() == 1",
        message=f"{at} must set exactly one of " + ", ".join(keys),
        check=lambda value: sum(_has(value, k) for k in keys) == 1,
        example_spec=example,
    )


def _needs_pretrained_rule(rule_id: str, key: str, example: Any) -> Rule:
    """A source of pretrained weights (spec.<key>) needs spec.pretrained."""
    return Rule(
        id=rule_id,
        at="spec",
        cel=f"!(has(self.{key}) && has(self.pretrained) && !self.pretrained)",
        message=f"spec.{key} is a source of pretrained weights, and spec.pretrained is false: "
                f"drop spec.{key}, or set spec.pretrained: true",
        check=lambda spec: not (_has(spec, key) and _has(spec, "pretrained") and not spec["pretrained"]),
        example_spec={"pretrained": False, key: example},
        field_path=f".{key}",
    )


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
        check=lambda spec: _dig(spec, keys) is None or "/../" not in f"/{_dig(spec, keys)}/",
        example_spec=example,
        field_path=f".{dotted}",
    )


# user[:password]@ before a URL's host (CEL and Python alike: RE2 and re agree on it)
_USERINFO_RE = "^[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#]*@"
# MLflow's own variables that spec.tracking.mlflow sets (the URI as a flag, the rest from its Secret)
MLFLOW_ENV = ["MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
              "MLFLOW_TRACKING_TOKEN"]
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


def _elastic_ordered(elastic: dict[str, Any]) -> bool:
    """spec.elastic's bounds are in order (or not both set): the rule on spec.replicas is quiet otherwise,
    so the error names the bounds."""
    return not _has(elastic, "minReplicas") or not _has(elastic, "maxReplicas") \
        or elastic["minReplicas"] <= elastic["maxReplicas"]


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
    _exactly_one_rule("dataset-exactly-one", "spec.dataset", DATASET_SOURCES,
                      {"dataset": {"synthetic": {}, "hostPath": {"path": "/srv/pets"}}}),
    _exactly_one_rule("output-exactly-one", "spec.output", _OUTPUT_VOLUMES,
                      {"output": {"emptyDir": {}, "persistentVolumeClaim": {"claimName": "out"}}}),
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
    _needs_pretrained_rule("weights-need-pretrained", "weights", "/w.safetensors"),
    _needs_pretrained_rule("pretrained-cache-needs-pretrained", "pretrainedCache",
                           {"persistentVolumeClaim": {"claimName": "hub"}}),
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
        check=lambda spec: not _dig(spec, ("resources", "gpu")) or not _has(spec, "processesPerReplica")
        or spec["processesPerReplica"] <= spec["resources"]["gpu"],
        example_spec={"processesPerReplica": 4, "resources": {"gpu": 2}},
        field_path=".processesPerReplica",
    ),
    # A resize (kubectl scale, an edit) is bounded by spec.elastic; the scale subresource writes
    # spec.replicas, so the CRD's own rule checks it there too.
    Rule(
        id="replicas-within-elastic",
        at="spec",
        cel="!has(self.elastic) || (has(self.elastic.minReplicas) && has(self.elastic.maxReplicas) && "
            "self.elastic.minReplicas > self.elastic.maxReplicas) || ((!has(self.elastic.minReplicas) || "
            "self.replicas >= self.elastic.minReplicas) && "
            "(!has(self.elastic.maxReplicas) || self.replicas <= self.elastic.maxReplicas))",
        message="spec.replicas must be within spec.elastic.minReplicas and spec.elastic.maxReplicas: "
                "scale within them, or change the bounds (with spec.suspend: true while it runs)",
        check=lambda spec: not _has(spec, "elastic") or not _elastic_ordered(spec["elastic"])
        or ((not _has(spec["elastic"], "minReplicas") or spec["replicas"] >= spec["elastic"]["minReplicas"])
            and (not _has(spec["elastic"], "maxReplicas")
                 or spec["replicas"] <= spec["elastic"]["maxReplicas"])),
        example_spec={"replicas": 1, "elastic": {"minReplicas": 2, "maxReplicas": 2}},
        field_path=".replicas",
    ),
    # The trainer keeps the global batch (batchSize x maxReplicas x processesPerReplica) at every size by
    # gradient accumulation, which needs the size to divide it.
    Rule(
        id="replicas-divide-max",
        at="spec",
        cel="!has(self.elastic) || !has(self.elastic.maxReplicas) || "
            "self.replicas > self.elastic.maxReplicas || self.elastic.maxReplicas % self.replicas == 0",
        message="spec.replicas must divide spec.elastic.maxReplicas: the global batch, batchSize x "
                "maxReplicas x processesPerReplica, is kept at every size by gradient accumulation",
        check=lambda spec: (most := _dig(spec, ("elastic", "maxReplicas"))) is None
        or spec["replicas"] > most or most % spec["replicas"] == 0,
        example_spec={"replicas": 3, "elastic": {"maxReplicas": 4}},
        field_path=".replicas",
    ),
    Rule(
        id="elastic-min-not-above-max",
        at="spec.elastic",
        cel="!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
        message="spec.elastic.minReplicas must not exceed spec.elastic.maxReplicas",
        check=_elastic_ordered,
        example_spec={"replicas": 2, "elastic": {"minReplicas": 3, "maxReplicas": 2}},
        field_path=".minReplicas",
    ),
    Rule(
        id="output-claim-writable",
        at="spec",
        cel="!has(self.output) || !has(self.output.persistentVolumeClaim) || "
            "!has(self.output.persistentVolumeClaim.readOnly) || "
            "!self.output.persistentVolumeClaim.readOnly",
        message="spec.output.persistentVolumeClaim.readOnly must be false: the trainer writes there",
        check=lambda spec: not _dig(spec, ("output", "persistentVolumeClaim", "readOnly")),
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
        check=lambda dataset: not re.search(_USERINFO_RE, _dig(dataset, ("s3", "endpoint")) or ""),
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
    # spec.tracking.mlflow: the server's address and its credentials each come from one place.
    Rule(
        id="mlflow-uri-no-credentials",
        at="spec.tracking.mlflow",
        cel=f"!self.uri.matches('{_USERINFO_RE}')",
        message="spec.tracking.mlflow.uri must not carry credentials (user:password@ before the host): they "
                "would ride in the pods' arguments and the run's params; put them in a Secret named by "
                "spec.tracking.mlflow.credentialsSecret",
        check=lambda mlflow: not re.search(_USERINFO_RE, mlflow["uri"]),
        example_spec={"tracking": {"mlflow": {"uri": "http://user:secret@mlflow.example:5000"}}},
        field_path=".uri",
    ),
    Rule(
        id="mlflow-not-in-env",
        at="spec",
        cel="!(has(self.tracking) && has(self.tracking.mlflow) && has(self.env)) || "
            "!self.env.exists(e, e.name in [" + ", ".join(f"'{n}'" for n in MLFLOW_ENV) + "])",
        message="spec.env must not set " + ", ".join(MLFLOW_ENV) + " when spec.tracking.mlflow is set: "
                "spec.tracking.mlflow.uri names the server and spec.tracking.mlflow.credentialsSecret the "
                "Secret with its credentials",
        check=lambda spec: _dig(spec, ("tracking", "mlflow")) is None or not _has(spec, "env")
        or not any(e["name"] in MLFLOW_ENV for e in spec["env"]),
        example_spec={"tracking": {"mlflow": {"uri": "http://mlflow.example:5000"}},
                      "env": [{"name": "MLFLOW_TRACKING_TOKEN", "value": "t"}]},
        field_path=".env",
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


