"""The PetsTraining API as the rest of the operator reads it (`api.<NAME>`), and the local twin of the
API server: `resolve_spec` applies the schema's defaults and every rule, for `pets-operator render`
(which runs without an API server) and for the operator itself.

The parts, each in one place: the names (`pets_contract.names`), the defaults and value patterns
(`defaults`), the cross-field rules, each a `Rule` whose CEL and Python twin sit side by side and whose
local error is the API server's text (`rules`), the spec's schema and the admission policy
(`schema`), the status' schema (`status_schema`). `pets_operator.crd` turns them into the
CustomResourceDefinition the chart ships (a unit test checks the committed file matches).
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Mapping
from typing import Any

from pets_contract.names import (  # noqa: F401  (the API's names: api.<NAME>)
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
from pets_operator.defaults import (  # noqa: F401  (its defaults, patterns and SpecError)
    DATA_DIR,
    DATASET_CACHE_DIR,
    DATASET_CACHE_PREFIX,
    DEFAULT_CLUSTER_DOMAIN,
    DEFAULT_DATASET_CACHE_SIZE,
    DEFAULT_OUTPUT_CLAIM_SIZE,
    DEFAULT_PROGRESS_INTERVAL,
    DEFAULT_SCRAPE_CONCURRENCY,
    DEFAULT_SCRAPE_TIMEOUT,
    DEFAULT_STORAGE_CLASS_ANNOTATION,
    DEFAULT_WORKERS,
    DNS_SUBDOMAIN,
    ENV_NAME,
    KUEUE_LABELS,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    MAX_NAME_LENGTH,
    PRETRAINED_CACHE_DIR,
    QUANTITY,
    RESERVED_ENV,
    SpecError,
)
from pets_operator.rules import RULES, Rule, _re2, _validations, rules_at
from pets_operator.schema import (  # noqa: F401
    IMMUTABILITY_POLICY,
    MUTABLE_WHILE_RUNNING,
    RESIZABLE_WHILE_RUNNING,
    SPEC_SCHEMA,
    immutability_validations,
    immutable_while_running,
)
from pets_operator.spec import Spec
from pets_operator.status_schema import STATUS_SCHEMA

# Fields added after 0.1.0 whose defaults the operator applies (resolve_spec) but the API server does not
# store: an object made by this release then holds only what its user set, so after a `helm rollback`
# the previous operator, which digests every spec field it does not know of, reads the same spec its
# workload was built from instead of rebuilding it (make test-upgrade).
DEFAULTED_BY_THE_OPERATOR = ("elastic", "tracking")


def stored_spec(spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """The spec as the API server stores it: resolve_spec's, less the defaults only the operator applies
    where the user left the field out."""
    given = spec or {}
    return {k: v for k, v in resolve_spec(dict(given)).to_dict().items()
            if k not in DEFAULTED_BY_THE_OPERATOR or k in given}


def object_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the whole PetsTraining object."""
    spec = copy.deepcopy(SPEC_SCHEMA)
    for name in DEFAULTED_BY_THE_OPERATOR:
        spec["properties"][name].pop("default", None)
    return {
        "type": "object",
        "description": "Distributed fine-tuning of the Accelerate Pets recipe (timm resnet50d).",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            # name declared (the only field a CRD may restrict) so the name rule's fieldPath can point at it
            "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
            "spec": spec,
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


def output_of(spec: Spec) -> Mapping[str, Any]:
    """spec.output, or (unset: the operator put none in) the default output."""
    return spec.output or DEFAULT_OUTPUT


def resolve_spec(spec: Any) -> Spec:
    """Defaulted and validated spec, as the API server would store it (`Spec.to_dict()`). Raises
    SpecError naming the field.

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
    return Spec.from_dict(resolved)
