"""Pack a root filesystem directory into a one-layer OCI image archive for `ctr images import`.

There is no registry here, so the images the local node needs (the pause sandbox, the smoke-test
image) are made from files on this machine. The archive is an OCI image layout (oci-layout,
index.json, blobs/sha256/...) in a tar; the index carries `io.containerd.image.name` so containerd
imports it under the given name. The output is reproducible: fixed timestamps and owners.

Why not a tool: Debian's umoci/skopeo/buildah would do it, but each pulls in more packages and
state than the ~80 lines below, which use only the standard library.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"


@dataclass(frozen=True)
class Blob:
    media_type: str
    data: bytes

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    def descriptor(self, **extra: object) -> dict[str, object]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": len(self.data), **extra}


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def layer_tar(rootfs: Path) -> bytes:
    """An uncompressed layer tar of `rootfs`, entries sorted, owners and mtimes fixed."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        paths = sorted(rootfs.rglob("*"), key=lambda p: p.relative_to(rootfs).as_posix())
        for path in paths:
            info = tar.gettarinfo(str(path), arcname=path.relative_to(rootfs).as_posix())
            info.mtime = 0
            if info.isfile():
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    return buf.getvalue()


def image_blobs(
    layer: bytes, entrypoint: list[str], env: list[str], user: str, workdir: str
) -> tuple[Blob, Blob, Blob]:
    """(layer, config, manifest) blobs of a linux/amd64 image with one layer."""
    layer_blob = Blob(MEDIA_LAYER, layer)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": env, "User": user, "WorkingDir": workdir},
        "rootfs": {"type": "layers", "diff_ids": [layer_blob.digest]},
    }
    config_blob = Blob(MEDIA_CONFIG, _canonical(config))
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": config_blob.descriptor(),
        "layers": [layer_blob.descriptor()],
    }
    return layer_blob, config_blob, Blob(MEDIA_MANIFEST, _canonical(manifest))


def index_json(manifest: Blob, name: str) -> bytes:
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    annotations = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag}
    platform = {"architecture": "amd64", "os": "linux"}
    descriptor = manifest.descriptor(annotations=annotations, platform=platform)
    return _canonical({"schemaVersion": 2, "manifests": [descriptor]})


def write_archive(output: Path, blobs: list[Blob], index: bytes) -> None:
    def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(output, mode="w") as tar:
        add(tar, "oci-layout", _canonical({"imageLayoutVersion": "1.0.0"}))
        add(tar, "index.json", index)
        for blob in blobs:
            add(tar, "blobs/sha256/" + blob.digest.split(":", 1)[1], blob.data)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rootfs", type=Path, required=True, help="directory that becomes the image's /")
    ap.add_argument("--name", required=True, help="image name, e.g. localhost/pets-training/pause:3.10")
    ap.add_argument("--entrypoint", nargs="+", default=[], help="entrypoint argv")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE, repeatable")
    ap.add_argument("--user", default="0:0", help="uid:gid the container runs as")
    ap.add_argument("--workdir", default="/", help="working directory")
    ap.add_argument("--output", type=Path, required=True, help="archive to write")
    args = ap.parse_args(argv)
    if not args.rootfs.is_dir():
        ap.error(f"--rootfs: '{args.rootfs}' is not a directory")
    env = args.env or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    for item in env:
        if "=" not in item:
            ap.error(f"--env: '{item}' is not KEY=VALUE")
    blobs = image_blobs(layer_tar(args.rootfs), args.entrypoint, env, args.user, args.workdir)
    write_archive(args.output, list(blobs), index_json(blobs[2], args.name))
    print(f"{args.output}: {args.name} {blobs[2].digest} ({os.path.getsize(args.output)} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
