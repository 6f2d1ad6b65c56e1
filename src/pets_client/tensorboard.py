"""`kubectl pets tensorboard`: the pure parts. Which claims to serve, the TensorBoard pod (fetch's helper
pod, serving instead of sleeping) and its command. The adapter that starts it and forwards a local port
is serve.py."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

from pets_contract.names import TENSORBOARD_DIR

from . import _api, transfer
from .errors import TensorBoardError
from .transfer import helper_pod, output_claim

PORT = 6006  # TensorBoard's own default, in the pod
COMPONENT = "tensorboard"  # the pod's component label and its container's name
SERVED_LABEL = f"{_api.GROUP}/tensorboard-of"
# activeDeadlineSeconds: a pod whose client died without deleting it goes by itself after this
LIFETIME_S = 8 * 3600
ALL_ROOT = "/outputs"  # --all: each training's claim under /outputs/<name>


@dataclass(frozen=True)
class Served:
    """One training's output claim, as the TensorBoard pod mounts it."""

    name: str  # the training: TensorBoard's run name with --all
    claim: str
    sub_path: str  # the directory in the claim (spec.output.persistentVolumeClaim.path), "" for its root
    mount_path: str

    @property
    def logdir(self) -> str:
        return posixpath.join(self.mount_path, TENSORBOARD_DIR)


def no_claim_reason(training: dict[str, Any]) -> str | None:
    """Why TensorBoard cannot read ``training``'s files (naming spec.output), or None."""
    return transfer.no_claim_reason(training, lost="its TensorBoard files went with them",
                                    kept=f"the TensorBoard files under <output>/{TENSORBOARD_DIR}")


def served(trainings: list[dict[str, Any]], *, all_: bool) -> tuple[list[Served], list[str]]:
    """The claims to mount and the reasons the others are left out. One training: mounted at /output,
    and TensorBoardError when it has no claim. ``all_``: each training with a claim under
    /outputs/<name> (the rest left out with their reason); TensorBoardError when none has one."""
    kept, skipped = [], []
    for training in sorted(trainings, key=lambda t: t["metadata"]["name"]):
        name = training["metadata"]["name"]
        if reason := no_claim_reason(training):
            skipped.append(reason)
            continue
        claim = output_claim(training) or {}
        kept.append(Served(name=name, claim=str(claim["claimName"]),
                           sub_path=str(claim.get("path") or "").strip("/"),
                           mount_path=posixpath.join(ALL_ROOT, name) if all_ else _api.OUTPUT_DIR))
    if skipped and not all_:
        raise TensorBoardError(skipped[0])
    if not kept:
        raise TensorBoardError("no training of the namespace keeps its outputs on a claim"
                               + "".join(f"\n  {r}" for r in skipped))
    return kept, skipped


def logdir_spec(mounts: list[Served]) -> str:
    """TensorBoard's --logdir_spec, ``name:dir,...``: each training a run of its own. Kubernetes names
    hold neither ',' nor ':', so none needs quoting."""
    for m in mounts:
        if "," in m.name or ":" in m.name:
            raise TensorBoardError(f"{m.name!r} cannot name a TensorBoard run (',' or ':' in it)")
    return ",".join(f"{m.name}:{m.logdir}" for m in mounts)


def command(mounts: list[Served], *, several: bool) -> list[str]:
    """The pod's command: one training's directory as --logdir, several as --logdir_spec."""
    where = ["--logdir_spec", logdir_spec(mounts)] if several else ["--logdir", mounts[0].logdir]
    return ["tensorboard", *where, "--bind_all", "--port", str(PORT)]


def pod(mounts: list[Served], *, image: str, several: bool, scheduling: dict[str, Any] | None = None,
        lifetime_s: int = LIFETIME_S) -> dict[str, Any]:
    """The TensorBoard pod: fetch's helper pod (the trainer's uid, no privilege, read-only root and
    claims, its deadline) with every claim mounted read-only, TensorBoard as its command, and /tmp
    writable (TensorBoard keeps its info files there). A claim two trainings share is one volume."""
    owner = "pets" if several else mounts[0].name
    manifest = helper_pod(owner=owner, component=COMPONENT, image=image, claim_name=mounts[0].claim,
                          volume_name="claim-0", mount_path=mounts[0].mount_path, read_only=True,
                          sub_path=mounts[0].sub_path, scheduling=scheduling, lifetime_s=lifetime_s,
                          labels={} if several else {SERVED_LABEL: owner})
    volumes: dict[str, str] = {}  # claim -> volume name
    for m in mounts:
        volumes.setdefault(m.claim, f"claim-{len(volumes)}")
    spec = manifest["spec"]
    spec["volumes"] = [{"name": v, "persistentVolumeClaim": {"claimName": c, "readOnly": True}}
                       for c, v in volumes.items()] + [{"name": "tmp", "emptyDir": {}}]
    container = spec["containers"][0]
    container["volumeMounts"] = [
        {"name": volumes[m.claim], "mountPath": m.mount_path, "readOnly": True}
        | ({"subPath": m.sub_path} if m.sub_path else {}) for m in mounts] + [
        {"name": "tmp", "mountPath": "/tmp"}]
    container["command"] = command(mounts, several=several)
    container["ports"] = [{"name": "http", "containerPort": PORT, "protocol": "TCP"}]
    container["readinessProbe"] = {"tcpSocket": {"port": PORT}, "periodSeconds": 2}
    container["livenessProbe"] = {"tcpSocket": {"port": PORT}, "initialDelaySeconds": 30, "periodSeconds": 10}
    # TensorBoard holds the scalars it read in memory: more than a copy helper needs
    container["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"},
                              "limits": {"cpu": "1", "memory": "1Gi"}}
    return manifest


def scheduling_of(trainings: list[dict[str, Any]], *, several: bool) -> dict[str, Any]:
    """Where the pod may run: one training's own placement (its claim may be bound to its nodes);
    with several, only every training's imagePullSecrets (no one's nodeSelector binds the others)."""
    specs = [t.get("spec") or {} for t in trainings]
    if not several:
        return specs[0]
    secrets: list[dict[str, Any]] = []
    for s in specs:
        secrets += [x for x in s.get("imagePullSecrets") or [] if x not in secrets]
    return {"imagePullSecrets": secrets}


def local_url(port: int) -> str:
    return f"http://localhost:{port}/"
