"""`pets-operator render`: the manifests the operator would create for a PetsTraining, offline."""

from __future__ import annotations

import sys
from typing import Any

import yaml

from pets_operator import api, backends, builders


def render_object(
    obj: dict[str, Any],
    *,
    backend: str | None = None,
    namespace: str | None = None,
    default_image: str = api.DEFAULT_IMAGE,
    cluster_domain: str = api.DEFAULT_CLUSTER_DOMAIN,
) -> list[dict[str, Any]]:
    """Validate one PetsTraining object as the API server would and build its children (attempt 0).

    A spec the server refuses is refused here with the server's words (`api.check_name`,
    `api.resolve_spec`), except the immutable-while-running rules, which need the old object.
    """
    if not isinstance(obj, dict):
        raise api.SpecError(f"a PetsTraining must be a mapping, got {type(obj).__name__}")
    if obj.get("apiVersion") != api.API_VERSION or obj.get("kind") != api.KIND:
        raise api.SpecError(
            f"apiVersion/kind must be {api.API_VERSION}/{api.KIND}, "
            f"got {obj.get('apiVersion')!r}/{obj.get('kind')!r}"
        )
    meta = obj.get("metadata") or {}
    name = api.check_name(meta.get("name"))
    spec = api.resolve_spec(obj.get("spec"))
    target = builders.Target(
        name=name,
        namespace=meta.get("namespace") or namespace or "default",
        default_image=default_image,
        cluster_domain=cluster_domain,
        queue_labels=builders.queue_labels(meta.get("labels")),
    )
    # No cluster to ask: an explicit spec.backend wins, and 'auto' becomes --backend (default job), as
    # on a cluster that serves that backend to an operator whose --auto-backend names it.
    served = {name for name in (backend, spec.backend) if name and name != "auto"}
    return backends.resolve(spec, served, auto=backend or backends.DEFAULT_AUTO).children(spec, target)


def render_file(filename: str, **kwargs: Any) -> str:
    """Render every PetsTraining in a YAML file (or `-` for stdin) as one YAML stream."""
    if filename == "-":
        docs = list(yaml.safe_load_all(sys.stdin))
    else:
        with open(filename, encoding="utf-8") as fh:
            docs = list(yaml.safe_load_all(fh))
    # Other objects in the file (a PVC beside the training, say) are not the operator's to render.
    docs = [d for d in docs if isinstance(d, dict) and d.get("kind") == api.KIND]
    if not docs:
        raise api.SpecError(f"{filename}: no PetsTraining found")
    manifests = [m for doc in docs for m in render_object(doc, **kwargs)]
    return yaml.safe_dump_all(manifests, sort_keys=False, explicit_start=True)
