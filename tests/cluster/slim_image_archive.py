"""Turn a `docker save` stream into an OCI image layout without the layers a node has unpacked already.

Why: the trainer is 6 GB, and `docker save | ctr images import -` cost about two minutes a node on the
2-core CI machine even when only its 1.5 MB code layer had changed. containerd's import of docker's
legacy archive (Docker 20.10, Debian's docker.io) writes every layer to its content store and gzips
each one (images/archive/importer.go, resolveLayers), whether or not the node had that layer before.
An OCI layout is taken as it is, and a layer whose snapshot exists is not unpacked again, so its blob
is not needed at all. This script converts, and leaves out each layer whose snapshot the node lists
(`ctr snapshots ls`: a snapshot is named by the layer's chain id).

A legacy archive names a layer by a directory (`<v1 id>/layer.tar`), not by its digest, and gives the
digests (the config's rootfs.diff_ids) only in manifest.json, at the end of the stream. So each run
records `<v1 id>/layer.tar -> chain id` in LAYER_MAP, and the next run can leave a layer out before
reading it. Docker derives a v1 id from the layer's whole chain, so one id always names one chain.

An archive that is an OCI layout already (Docker 25 and later) passes through, less the blobs that
PRESENT lists.

usage: docker save IMAGE | slim_image_archive.py PRESENT LAYER_MAP | ctr images import -
       slim_image_archive.py --config-only CONFIG IMAGE_ID IMAGE PRESENT EARLIER_MANIFEST \
         | ctr images import -
  PRESENT    a file with the node's `ctr snapshots ls` (and `ctr content ls`) output: its sha256 words
  LAYER_MAP  a file of "<v1 id>/layer.tar sha256:<chain id>" lines, read and then updated
  --config-only: no `docker save` at all, when the node has every layer of the image unpacked: CONFIG is
  the image's config as docker keeps it (its sha256 is IMAGE_ID), EARLIER_MANIFEST the manifest of the
  build the node holds (`ctr content get`), for the layers' sizes; exit 3, writing nothing, when not
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import re
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

STREAM_BUFFER = 1 << 20
OCI_BLOB = re.compile(r"^blobs/sha256/([0-9a-f]{64})$")
LEGACY_LAYER = re.compile(r"^[0-9a-f]{64}/layer\.tar$")
LEGACY_CONFIG = re.compile(r"^[0-9a-f]{64}\.json$")
LEGACY_METADATA = re.compile(r"^([0-9a-f]{64}/(json|VERSION)?|repositories)$")
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"


def present_digests(listing: str) -> set[str]:
    """The sha256 digests in `ctr snapshots ls` or `ctr content ls` output."""
    return set(re.findall(r"sha256:[0-9a-f]{64}", listing))


def read_layer_map(text: str) -> dict[str, str]:
    return dict(line.split() for line in text.splitlines() if len(line.split()) == 2)


def chain_ids(diff_ids: list[str]) -> list[str]:
    """The OCI chain id of each layer: the name of its unpacked snapshot in containerd."""
    chains = [diff_ids[0]] if diff_ids else []
    for diff_id in diff_ids[1:]:
        chains.append("sha256:" + hashlib.sha256(f"{chains[-1]} {diff_id}".encode()).hexdigest())
    return chains


def containerd_name(docker_name: str) -> str:
    """pets-training/trainer:0.1.0 -> docker.io/pets-training/trainer:0.1.0, as containerd names it."""
    first, _, rest = docker_name.partition("/")
    if not rest:
        return f"docker.io/library/{docker_name}"
    if "." in first or ":" in first or first == "localhost":
        return docker_name
    return f"docker.io/{docker_name}"


def _json(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _descriptor(media_type: str, data: bytes, **extra: object) -> dict[str, object]:
    return {"mediaType": media_type, "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
            "size": len(data), **extra}


@dataclass
class Conversion:
    """What one pass over an archive saw: its legacy configs, layer sizes and manifest."""
    layer_map: dict[str, str]
    configs: dict[str, bytes] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    manifests: list[dict[str, object]] = field(default_factory=list)
    oci_index_seen: bool = False
    passed: int = 0
    left_out: int = 0

    def layer_size(self, path: str) -> int:
        return self.sizes[self.links.get(path, path)]

    def legacy_images(self) -> list[tuple[str, bytes, list[dict[str, object]]]]:
        """(name, config, layer descriptors) of each tag of the legacy archive; records the layer map."""
        images = []
        for manifest in self.manifests:
            config = self.configs[str(manifest["Config"])]
            diff_ids = json.loads(config)["rootfs"]["diff_ids"]
            layer_paths = [str(p) for p in manifest["Layers"]]  # type: ignore[attr-defined]
            if len(diff_ids) != len(layer_paths):
                raise ValueError(f"{manifest['Config']}: {len(diff_ids)} diff_ids, {len(layer_paths)} layers")
            layers = []
            for path, digest, chain in zip(layer_paths, diff_ids, chain_ids(diff_ids), strict=True):
                self.layer_map[path] = chain
                layers.append({"mediaType": MEDIA_LAYER, "digest": digest, "size": self.layer_size(path)})
            for tag in manifest.get("RepoTags") or []:  # type: ignore[attr-defined]
                images.append((containerd_name(str(tag)), config, layers))
        return images


def convert(src: BinaryIO, dst: BinaryIO, present: set[str], layer_map: dict[str, str]) -> Conversion:
    """Stream the archive `src` to `dst` as an OCI layout without the layers and blobs in `present`."""
    seen = Conversion(layer_map)
    with tarfile.open(fileobj=src, mode="r|", bufsize=STREAM_BUFFER) as tar_in, \
            tarfile.open(fileobj=dst, mode="w|", bufsize=STREAM_BUFFER, format=tarfile.PAX_FORMAT) as tar_out:
        tar_out.copybufsize = STREAM_BUFFER  # type: ignore[attr-defined]  # its 16 KB default: CPU-bound

        for member in tar_in:
            name = member.name.removeprefix("./")
            if member.issym() and LEGACY_LAYER.match(name):
                target = posixpath.join(posixpath.dirname(name), member.linkname)
                seen.links[name] = posixpath.normpath(target)
                continue
            if member.isfile() and LEGACY_LAYER.match(name):
                seen.sizes[name] = member.size
                if layer_map.get(name) in present:
                    seen.left_out += 1
                    continue
                # Any name does: containerd files a blob under the digest of its bytes.
                member.name = "blobs/sha256/layer-" + name.split("/")[0]
            elif member.isfile() and LEGACY_CONFIG.match(name):
                seen.configs[name] = tar_in.extractfile(member).read()  # type: ignore[union-attr]
                continue
            elif name == "manifest.json" and member.isfile():
                seen.manifests = json.loads(tar_in.extractfile(member).read())  # type: ignore[union-attr]
                continue
            elif LEGACY_METADATA.match(name):
                continue
            elif (match := OCI_BLOB.match(name)) and "sha256:" + match.group(1) in present:
                seen.left_out += 1
                continue
            seen.oci_index_seen |= name == "index.json"
            tar_out.addfile(member, tar_in.extractfile(member) if member.isfile() else None)
            seen.passed += 1

        if not seen.oci_index_seen:
            images = seen.legacy_images()
            if not images:
                raise ValueError("the archive has no OCI index.json and no docker manifest.json with tags")
            _add_index(tar_out, images)
    return seen


def _add_file(tar_out: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar_out.addfile(info, io.BytesIO(data))


def _add_index(tar_out: tarfile.TarFile, images: list[tuple[str, bytes, list[dict[str, object]]]]) -> None:
    """The configs, manifests, oci-layout and index.json of IMAGES: (name, config, layer descriptors)."""
    index = []
    for image_name, config, layers in images:
        _add_file(tar_out, "blobs/sha256/config-" + hashlib.sha256(config).hexdigest(), config)
        manifest = _json({"schemaVersion": 2, "mediaType": MEDIA_MANIFEST,
                          "config": _descriptor(MEDIA_CONFIG, config), "layers": layers})
        _add_file(tar_out, "blobs/sha256/manifest-" + hashlib.sha256(manifest).hexdigest(), manifest)
        index.append(_descriptor(MEDIA_MANIFEST, manifest, annotations={
            "io.containerd.image.name": image_name,
            "org.opencontainers.image.ref.name": image_name.rsplit(":", 1)[-1]}))
    _add_file(tar_out, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
    _add_file(tar_out, "index.json",
              _json({"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": index}))


def config_only(dst: BinaryIO, config: bytes, image_id: str, docker_name: str, present: set[str],
                earlier_manifest: bytes) -> str | None:
    """An OCI layout of the image whose config is CONFIG with no layer at all, written to DST, when the node
    has every layer unpacked (PRESENT) and its EARLIER_MANIFEST (the build it holds) gives each layer's
    size; else why not, and nothing written. The usual case: a commit that changed neither src/ nor
    operator/ gives the trainer a new config (its revision label) and the same layers, and then nothing
    of the 6 GB needs reading, not even by `docker save`."""
    if "sha256:" + hashlib.sha256(config).hexdigest() != image_id:
        return f"the config read is not image {image_id}"
    diff_ids = json.loads(config)["rootfs"]["diff_ids"]
    missing = [d for d, chain in zip(diff_ids, chain_ids(diff_ids), strict=True) if chain not in present]
    if missing:
        return f"{len(missing)} of its {len(diff_ids)} layers are not unpacked on the node"
    earlier = json.loads(earlier_manifest) if earlier_manifest.strip() else {}
    sizes = {str(layer["digest"]): int(layer["size"]) for layer in earlier.get("layers", [])}
    if any(d not in sizes for d in diff_ids):
        return "the node's earlier build does not give every layer's size"
    layers: list[dict[str, object]] = [{"mediaType": MEDIA_LAYER, "digest": d, "size": sizes[d]}
                                       for d in diff_ids]
    with tarfile.open(fileobj=dst, mode="w|", format=tarfile.PAX_FORMAT) as tar_out:
        _add_index(tar_out, [(containerd_name(docker_name), config, layers)])
    return None


def main(argv: list[str]) -> int:
    if len(argv) == 7 and argv[1] == "--config-only":
        config_file, image_id, docker_name, present_file, manifest_file = argv[2:]
        why_not = config_only(sys.stdout.buffer, Path(config_file).read_bytes(), image_id, docker_name,
                              present_digests(Path(present_file).read_text()),
                              Path(manifest_file).read_bytes())
        if why_not:
            print(f"slim_image_archive: not the config alone: {why_not}", file=sys.stderr)
            return 3
        print("slim_image_archive: the config alone: every layer is unpacked on the node", file=sys.stderr)
        return 0
    if len(argv) != 3:
        print(__doc__.strip().split("\n\n")[-1], file=sys.stderr)
        return 2
    present = present_digests(Path(argv[1]).read_text())
    map_file = Path(argv[2])
    layer_map = read_layer_map(map_file.read_text()) if map_file.exists() else {}
    seen = convert(sys.stdin.buffer, sys.stdout.buffer, present, layer_map)
    # Several nodes' conversions may finish at once: each writes whole, and the last rename wins.
    partial = map_file.with_name(f"{map_file.name}.{os.getpid()}")
    partial.write_text("".join(f"{path} {chain}\n" for path, chain in sorted(layer_map.items())))
    partial.replace(map_file)
    print(f"slim_image_archive: {seen.passed} entries passed on, {seen.left_out} layers the node has"
          " left out", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
