"""OpenAPI v3 schemas of Kubernetes core types, for embedding in the PetsTraining CRD.

The PetsTraining spec passes some pod fields straight into the trainer pod (affinity, tolerations,
nodeSelector, env, imagePullSecrets). Declared as free-form objects, a bad value passes
`kubectl apply` and only fails when the operator creates the Job; with the real schema the API server
refuses it at once, naming the field. This module builds those schemas the way controller-gen embeds
them, from the model metadata of the kubernetes Python client (each model's `openapi_types`,
`attribute_map`, field descriptions and required fields), recursively:

- no `$ref`: every model is inlined; a model already on the path (a cycle) or a node deeper than
  `MAX_DEPTH` becomes an object that preserves unknown fields, so the recursion always ends;
- `type` on every node; `Dict[str, X]` becomes an object with `additionalProperties`;
- what the client's metadata loses is restored from small tables: quantities (the client types them
  as `str`) and IntOrString (`object`) become `x-kubernetes-int-or-string`, and the enums Kubernetes'
  own OpenAPI declares for the fields we embed are kept (`ENUMS`).

Pure and deterministic for a given client version (the CRD header names it, see `client_version`).
"""

from __future__ import annotations

import re
from typing import Any

MAX_DEPTH = 12  # nesting of objects and arrays; affinity needs 7

# (model, JSON field) pairs the client types as `str` but Kubernetes types as resource.Quantity.
QUANTITY_FIELDS = {
    ("V1ResourceFieldSelector", "divisor"),
    ("V1EmptyDirVolumeSource", "sizeLimit"),
}
# (model, JSON field) pairs the client types as `object` but Kubernetes types as IntOrString.
INT_OR_STRING_FIELDS = {
    ("V1HTTPGetAction", "port"),
    ("V1TCPSocketAction", "port"),
}
# Enums of the fields we embed, as the API server (1.33) accepts them.
ENUMS: dict[tuple[str, str], list[str]] = {
    ("V1Toleration", "operator"): ["Exists", "Equal"],
    ("V1Toleration", "effect"): ["", "NoSchedule", "PreferNoSchedule", "NoExecute"],
    ("V1NodeSelectorRequirement", "operator"): ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"],
    ("V1LabelSelectorRequirement", "operator"): ["In", "NotIn", "Exists", "DoesNotExist"],
}
# A valid resource.Quantity, sign allowed (what resource.ParseQuantity accepts, slightly narrowed).
QUANTITY_PATTERN = r"^[+-]?([0-9]+(\.[0-9]+)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][-+]?[0-9]{1,2})?$"

_PRIMITIVES = {
    "str": {"type": "string"},
    "int": {"type": "integer"},
    "float": {"type": "number"},
    "bool": {"type": "boolean"},
    "date": {"type": "string", "format": "date"},
    "datetime": {"type": "string", "format": "date-time"},
    "bytearray": {"type": "string", "format": "byte"},
}
_LIST = re.compile(r"^(?:List\[|list\[)(.*)\]$")
_DICT = re.compile(r"^(?:Dict\[str,\s*|dict\(str,\s*)(.*)[\])]$")


def client_version() -> str:
    import kubernetes

    return str(kubernetes.__version__)


def _model(name: str) -> Any:
    from kubernetes import client

    model = getattr(client, name, None)
    if model is None or not hasattr(model, "openapi_types"):
        raise ValueError(f"the kubernetes client has no model {name!r}")
    return model


def _first_sentence(text: str | None) -> str:
    """The first sentence of a description (the CRD stays small; the rest is in the Kubernetes docs)."""
    if not text:
        return ""
    para = " ".join(text.strip().split("\n\n")[0].split())
    m = re.match(r"(.*?[.])(\s+[A-Z`(\"]|$)", para)
    if m and len(m.group(1)) < 16:  # "Required." says little: take the next sentence too
        m = re.match(r"(.*?[.]\s+.*?[.])(\s+[A-Z`(\"]|$)", para) or m
    return (m.group(1) if m else para).strip()


def _field_doc(model: Any, attr: str) -> str:
    fields = getattr(model, "model_fields", None)  # pydantic models (client >= 35)
    if fields is not None and attr in fields:
        return _first_sentence(fields[attr].description)
    prop = getattr(model, attr, None)  # older clients: the property's docstring
    doc = getattr(prop, "__doc__", None) or ""
    lines = [ln.strip() for ln in doc.strip().splitlines()[1:]]
    lines = [ln for ln in lines if ln and not ln.startswith(":")]
    return _first_sentence(" ".join(lines))


def _required(model: Any, attr: str) -> bool:
    fields = getattr(model, "model_fields", None)
    if fields is not None and attr in fields:
        return bool(fields[attr].is_required())
    import inspect

    setter = getattr(getattr(model, attr, None), "fset", None)
    try:
        return setter is not None and "must not be `None`" in inspect.getsource(setter)
    except (OSError, TypeError):
        return False


def _open(description: str) -> dict[str, Any]:
    return {"type": "object", "description": description, "x-kubernetes-preserve-unknown-fields": True}


def schema(type_ref: str, description: str = "", *, _path: tuple[str, ...] = (),
           _depth: int = 0) -> dict[str, Any]:
    """The schema of a client type reference: "V1Affinity", "List[V1Toleration]", "Dict[str, str]"..."""
    type_ref = type_ref.strip()
    if type_ref in _PRIMITIVES:
        return {**_PRIMITIVES[type_ref], "description": description or "A value."}
    if type_ref == "object":
        return _open(description or "Any value.")
    if _depth >= MAX_DEPTH:
        return _open(description or "Not expanded here (nested too deep).")
    if m := _LIST.match(type_ref):
        return {"type": "array", "description": description or "A list.",
                "items": schema(m.group(1), "", _path=_path, _depth=_depth + 1)}
    if m := _DICT.match(type_ref):
        return {"type": "object", "description": description or "A map.",
                "additionalProperties": schema(m.group(1), "A value.", _path=_path, _depth=_depth + 1)}
    model = _model(type_ref)
    description = description or _first_sentence(model.__doc__) or f"A Kubernetes {model.__name__}."
    if type_ref in _path:
        return _open(description)  # a cycle: stop here, as controller-gen does for recursive types
    properties: dict[str, Any] = {}
    required: list[str] = []
    for attr, sub in model.openapi_types.items():
        key = model.attribute_map[attr]
        doc = _field_doc(model, attr)
        if (type_ref, key) in QUANTITY_FIELDS:
            node = int_or_string(doc or "A quantity.", pattern=QUANTITY_PATTERN)
        elif (type_ref, key) in INT_OR_STRING_FIELDS:
            node = int_or_string(doc or "A number or a name.")
        else:
            node = schema(sub, doc, _path=(*_path, type_ref), _depth=_depth + 1)
        if (type_ref, key) in ENUMS:
            node["enum"] = list(ENUMS[type_ref, key])
        properties[key] = node
        if _required(model, attr):
            required.append(key)
    out: dict[str, Any] = {"type": "object", "description": description, "properties": properties}
    if required:
        out["required"] = required
    return out


def int_or_string(description: str, pattern: str | None = None) -> dict[str, Any]:
    """An int-or-string node (IntOrString, resource.Quantity) as a structural schema allows it."""
    out: dict[str, Any] = {
        "description": description,
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
    }
    if pattern:
        out["pattern"] = pattern  # checks the string form only
    return out


def field(model: str, json_name: str, description: str | None = None) -> dict[str, Any]:
    """The schema of one field of a client model, as Kubernetes declares it: ("V1PodSpec", "affinity")."""
    cls = _model(model)
    for attr, key in cls.attribute_map.items():
        if key == json_name:
            return schema(cls.openapi_types[attr], description or _field_doc(cls, attr), _path=(model,))
    raise ValueError(f"{model} has no field {json_name!r}")
