"""`make lint-k8s`: checkov's Kubernetes checks over every manifest we ship or create, against a skip list.

What is checked (rendered into one temp directory):
- the chart, `helm template` with its default values (what `make demo` and CI install) and with each
  `charts/pets-training/ci/*.yaml` variant, plus the NetworkPolicy on;
- what `pets-operator render` makes of `petstraining.yaml` and every PetsTraining in `examples/`, on the
  Job backend and on the PyTorchJob backend (`examples/pytorchjob.yaml`, and the sample as one);
- the client's `fetch` pod (`pets_client.transfer.fetch_pod`) and TensorBoard pod
  (`pets_client.tensorboard.pod`).

checkov reads a Job's pod template but not a PyTorchJob's (a custom resource), so each replica type's
template is checked as a Job of its own; the Worker's carries the init container the harness's
training-operator injects (`tests/cluster/pytorch-init-container.yaml`), as it does on a cluster.

Every failing check must be in `tests/lint_k8s_skips.yaml` (the check, the objects it fails on, and
why it does not apply: docs/operator.md, "Security checks (checkov)" lists the same); a skip that
no longer matches a failure fails too, so the list never hides more than it says.

    python tests/lint_k8s.py --checkov CHECKOV --helm HELM [--keep DIR]
"""

from __future__ import annotations

import argparse
import copy
import fnmatch
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "pets-training"
SKIPS = REPO / "tests" / "lint_k8s_skips.yaml"
INIT_TEMPLATE = REPO / "tests" / "cluster" / "pytorch-init-container.yaml"
# Trainings are rendered into a namespace of their own, as a team would run them (the operator puts
# a training's children in the training's namespace: which one is the user's choice, not ours).
TRAININGS_NAMESPACE = "team-a"


def chart_variants() -> dict[str, list[str]]:
    variants: dict[str, list[str]] = {"chart-default": []}
    for values in sorted((CHART / "ci").glob("*.yaml")):
        variants[f"chart-{values.stem}"] = ["--values", str(values)]
    variants["chart-networkpolicy"] = ["--values", str(CHART / "ci" / "namespaced-values.yaml"),
                                       "--set", "networkPolicy.enabled=true"]
    return variants


def render_chart(helm: str, out: Path) -> None:
    for name, args in chart_variants().items():
        result = subprocess.run([helm, "template", "pets", str(CHART), "--namespace", "pets-system", *args],
                                capture_output=True, text=True, check=False, timeout=120)
        if result.returncode != 0:
            sys.exit(f"helm template ({name}) failed:\n{result.stderr}")
        (out / f"{name}.yaml").write_text(result.stdout)


def init_container() -> dict[str, Any]:
    """The harness's init container, its Go-template fields filled as the training-operator fills them."""
    values = {"InitContainerImage": "localhost/pets-training/training-operator:v1.8.1", "MaxTries": "100",
              "MasterAddr": "pets-master-0"}
    text = re.sub(r"{{\.(\w+)}}", lambda m: values[m.group(1)], INIT_TEMPLATE.read_text())
    [init] = yaml.safe_load(text)
    return dict(init)


def as_checkable(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """A PyTorchJob becomes one Job per replica type, `<name>-<replica>`, holding that replica's pod
    template: checkov does not read custom resources, and a Job's template is checked as the batch pod
    it is (the Job backend's pods are checked the same way)."""
    if manifest.get("kind") != "PyTorchJob":
        return [manifest]
    jobs = []
    meta = manifest["metadata"]
    for replica, replica_spec in manifest["spec"]["pytorchReplicaSpecs"].items():
        template = copy.deepcopy(replica_spec["template"])
        if replica == "Worker":
            spec = template["spec"]
            spec["initContainers"] = [init_container(), *spec.get("initContainers", [])]
        jobs.append({"apiVersion": "batch/v1", "kind": "Job",
                     "metadata": {"name": f"{meta['name']}-{replica.lower()}", "namespace": meta["namespace"],
                                  "labels": meta.get("labels", {})},
                     "spec": {"template": template}})
    return jobs


def render_trainings(out: Path) -> None:
    from pets_operator import render

    from pets_client import tensorboard, transfer
    from pets_contract.names import DEFAULT_IMAGE

    samples = [REPO / "petstraining.yaml", *sorted((REPO / "examples").glob("*.yaml"))]
    for sample in samples:
        docs = [d for d in yaml.safe_load_all(sample.read_text()) if isinstance(d, dict)]
        trainings = [d for d in docs if d.get("kind") == "PetsTraining"]
        backends = ["job", "pytorchjob"] if sample.name == "petstraining.yaml" else ["job"]
        for backend in backends:
            manifests = [m for t in trainings
                         for m in render.render_object(t, backend=backend, namespace=TRAININGS_NAMESPACE)]
            if manifests:
                checkable = [c for m in manifests for c in as_checkable(m)]
                (out / f"render-{sample.stem}-{backend}.yaml").write_text(yaml.safe_dump_all(checkable))
    training = {"metadata": {"name": "pets", "namespace": TRAININGS_NAMESPACE},
                "spec": {"output": {"persistentVolumeClaim": {"claimName": "pets-results"}}}}
    pod = transfer.fetch_pod(training, DEFAULT_IMAGE, ["summary.json"])
    pod["metadata"] |= {"name": "pets-fetch", "namespace": TRAININGS_NAMESPACE}
    (out / "client-fetch-pod.yaml").write_text(yaml.safe_dump(pod))
    board = tensorboard.pod(tensorboard.served([training], all_=False)[0], image=DEFAULT_IMAGE, several=False)
    board["metadata"] |= {"name": "pets-tensorboard", "namespace": TRAININGS_NAMESPACE}
    (out / "client-tensorboard-pod.yaml").write_text(yaml.safe_dump(board))


def run_checkov(checkov: str, directory: Path) -> dict[str, Any]:
    result = subprocess.run(
        [checkov, "--directory", str(directory), "--framework", "kubernetes", "--output", "json",
         "--skip-download", "--compact"],
        capture_output=True, text=True, check=False, timeout=600,
    )
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        sys.exit(f"checkov printed no report (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")
    if isinstance(report, list):  # one report per framework
        [report] = [r for r in report if r.get("check_type") == "kubernetes"]
    return dict(report)


def load_skips() -> list[dict[str, Any]]:
    skips = yaml.safe_load(SKIPS.read_text())
    for skip in skips:
        missing = {"check", "resources", "reason"} - set(skip)
        if missing:
            sys.exit(f"{SKIPS}: the skip of {skip.get('check')} lacks {sorted(missing)}")
    return list(skips)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkov", required=True)
    parser.add_argument("--helm", required=True)
    parser.add_argument("--keep", help="render into this directory (kept) instead of a temp one")
    args = parser.parse_args(argv)
    skips = load_skips()
    with tempfile.TemporaryDirectory(prefix="pets-lint-k8s-") as tmp:
        out = Path(args.keep) if args.keep else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        render_chart(args.helm, out)
        render_trainings(out)
        report = run_checkov(args.checkov, out)
    summary = report["summary"]
    failed = report["results"].get("failed_checks", [])
    used: set[int] = set()
    unexpected = []
    for check in failed:
        matches = [i for i, s in enumerate(skips) if s["check"] == check["check_id"]
                   and any(fnmatch.fnmatchcase(check["resource"], p) for p in s["resources"])]
        used.update(matches)
        if not matches:
            unexpected.append(check)
    print(f"checkov {summary.get('checkov_version', '')} over {summary['resource_count']} objects: "
          f"{summary['passed']} passed, {len(unexpected)} failed, "
          f"{summary['failed'] - len(unexpected)} failed as {SKIPS.name} allows:")
    for i, skip in enumerate(skips):
        if i in used:
            count = sum(1 for c in failed if c["check_id"] == skip["check"]
                        and any(fnmatch.fnmatchcase(c["resource"], p) for p in skip["resources"]))
            print(f"  {skip['check']} x{count} ({skip['reason'].split(':')[0]})")
    stale = [s for i, s in enumerate(skips) if i not in used]
    for check in unexpected:
        print(f"FAILED {check['check_id']} {check['check_name']}: {check['resource']} "
              f"({Path(check['file_path']).name})")
    for skip in stale:
        print(f"STALE skip {skip['check']} on {skip['resources']}: no such failure any more; remove it "
              f"from {SKIPS.name} and from docs/operator.md")
    return 1 if unexpected or stale else 0


if __name__ == "__main__":
    sys.exit(main())
