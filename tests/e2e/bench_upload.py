"""`make bench-upload`: `kubectl pets upload` of a Pets-sized folder beside `kubectl cp` of the same
folder, into the same claim, through the same helper pod spec, in one run (issue 43).

The folder: 7,390 JPEGs of 500x375 (the Oxford-IIIT Pet set's count and typical size), from the
project's synthetic writer (``pets_training.synthetic.synthetic_image``, 500x500 cropped), made once under
$PETS_CACHE. Reported: seconds, files/s and MB/s of each (the median of ``--rounds``, taken in turn),
their ratio (ours, its pod's start included, over kubectl cp's into a running pod, and over kubectl
cp's with that pod's start; the target is 1.5 at most), and the second upload's seconds (it copies
nothing). The two copies are compared file by file in the pod (sha256) before anything is reported.

    tests/e2e/bench_upload.sh local [--files 7390] [--rounds 2] [--out output/bench-upload.json]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from PIL import Image

from pets_client import PetsTrainingClient
from pets_client.upload import claim_manifest, upload_pod, walk
from pets_contract.names import DEFAULT_IMAGE
from pets_training.synthetic import synthetic_image, synthetic_samples

CLASSES = 37
IMAGE = DEFAULT_IMAGE  # the trainer image make e2e loaded


def pets_folder(cache: Path, files: int) -> Path:
    """``files`` synthetic JPEGs of 500x375 in 37 classes (`<label>_<n>.jpg`), written once."""
    folder = cache / f"bench-upload-{files}x500x375"
    marker = folder.with_name(folder.name + ".complete")
    if marker.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    per_class = -(-files // CLASSES)
    samples = synthetic_samples(CLASSES, per_class)[:files]
    print(f"writing {len(samples)} synthetic JPEGs of 500x375 to {folder}", flush=True)
    for index, (name, label) in enumerate(samples):
        pixels: np.ndarray = synthetic_image(42, index, label, CLASSES, 500)[:375]
        Image.fromarray(pixels).save(folder / name, quality=90)
    marker.touch()
    return folder


def kubectl(*args: str, input_text: str | None = None, timeout: float = 3600) -> str:
    done = subprocess.run(["kubectl", *args], input=input_text, text=True, capture_output=True,
                          timeout=timeout, check=False)
    if done.returncode:
        raise SystemExit(f"kubectl {' '.join(args[:4])} ... failed: {done.stderr.strip()}")
    return done.stdout


def rates(files: int, size: int, seconds: float) -> dict[str, float]:
    return {"seconds": round(seconds, 2), "files_per_s": round(files / seconds, 1),
            "mb_per_s": round(size / 1e6 / seconds, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=7390)
    p.add_argument("--out", type=Path, default=Path("output/bench-upload.json"))
    p.add_argument("--image", default=IMAGE, help="the helper pods' image (both copies)")
    p.add_argument("--rounds", type=int, default=2, help="copies of each, in turn (the medians are compared)")
    args = p.parse_args(argv)
    cache = Path(os.environ.get("PETS_CACHE", Path.home() / ".cache" / "pets-training"))
    folder = pets_folder(cache, args.files)
    listing = walk(folder)
    total = sum(f.size for f in listing)
    print(f"{len(listing)} files, {total / 1e6:.1f} MB ({total / len(listing) / 1e3:.0f} kB a file)",
          flush=True)

    ns = f"bench-upload-{secrets.token_hex(3)}"
    kubectl("create", "namespace", ns)
    ours: list[float] = []
    cps: list[float] = []
    try:
        # the claim, and kubectl cp's pod of the upload pod's spec, made first: neither copy pays the
        # claim's making (upload makes one when there is none: 1-4 s here)
        claim = claim_manifest("pets-data", total * 2 * args.rounds, ["ReadWriteMany"])
        pod = upload_pod("pets-data", args.image, total, files=len(listing))
        pod["metadata"] = {"name": "kubectl-cp", "labels": pod["metadata"]["labels"]}
        # The claim bound before the pod: a pod made beside an unbound claim can wait out the
        # scheduler's 5-minute retry of unschedulable pods (seen on the 3-node cluster).
        kubectl("-n", ns, "apply", "-f", "-", input_text=yaml.safe_dump(claim))
        kubectl("-n", ns, "wait", "--for=jsonpath={.status.phase}=Bound", "pvc/pets-data", "--timeout=120s")
        started = time.monotonic()
        kubectl("-n", ns, "apply", "-f", "-", input_text=yaml.safe_dump(pod))
        kubectl("-n", ns, "wait", "--for=condition=Ready", "pod/kubectl-cp", "--timeout=300s")
        pod_start = time.monotonic() - started
        pets = PetsTrainingClient(namespace=ns)
        for i in range(args.rounds):  # side by side, in turn: this machine's load moves
            started = time.monotonic()
            kubectl("-n", ns, "cp", "-c", "upload", f"{folder}/.", f"kubectl-cp:/data/kcp-{i}")
            cps.append(time.monotonic() - started)
            started = time.monotonic()
            result = pets.upload(folder, claim="pets-data", path=f"/ours-{i}", image=args.image,
                                 progress=False)
            ours.append(time.monotonic() - started)
            assert result.copied == len(listing), result
            print(f"round {i + 1}: kubectl cp {cps[-1]:.1f} s, upload {ours[-1]:.1f} s", flush=True)
        started = time.monotonic()
        again = pets.upload(folder, claim="pets-data", path="/ours-0", image=args.image, progress=False)
        second = time.monotonic() - started
        assert again.copied == 0 and again.skipped == len(listing), again

        tree = "cd /data/$0 && find . -type f | sort | xargs sha256sum | sha256sum"
        sums = {d: kubectl("-n", ns, "exec", "kubectl-cp", "-c", "upload", "--", "sh", "-c", tree, d)
                for d in ("ours-0", "kcp-0")}
        assert sums["ours-0"] == sums["kcp-0"], f"the two copies differ: {sums}"
    finally:
        kubectl("delete", "namespace", ns, "--wait=false")

    up, cp = statistics.median(ours), statistics.median(cps)
    report: dict[str, Any] = {
        "files": len(listing), "bytes": total, "image_px": "500x375", "rounds": args.rounds,
        "upload": rates(len(listing), total, up) | {"each_s": [round(t, 2) for t in ours]},
        "upload_again_copies_nothing": {"seconds": round(second, 2)},
        "kubectl_cp": rates(len(listing), total, cp) | {"each_s": [round(t, 2) for t in cps]},
        "kubectl_cp_pod_start_s": round(pod_start, 2),
        "ratio_upload_over_kubectl_cp": round(up / cp, 2),
        "ratio_upload_over_kubectl_cp_with_its_pod_start": round(up / (cp + pod_start), 2),
        "target_ratio": 1.5,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
