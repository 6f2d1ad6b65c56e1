"""`pets-operator` CLI: render (no cluster), crd, and the run flags the chart relies on.

Also a contract test: the trainer flags the operator generates parse with the trainer's own parser
(pets_training.config), so the two sides of docs/contract.md cannot drift apart.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pets_operator import api, builders, cli, runner

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
# Every file that holds a PetsTraining (examples/results-claim.yaml is a claim alone).
SAMPLES = [p for p in [ROOT / "petstraining.yaml", *sorted((ROOT / "examples").glob("*.yaml"))]
           if "kind: PetsTraining" in p.read_text()]


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_render_every_sample(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["render", "-f", str(path)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = sorted(d["kind"] for d in docs)
    trainings = [d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == api.KIND]
    assert trainings, f"{path} has no PetsTraining"
    output = trainings[0]["spec"].get("output") or {"managedClaim": {}}  # unset: the default, a claim
    claim = ["PersistentVolumeClaim"] if "managedClaim" in output else []
    policy = ["NetworkPolicy"] if trainings[0]["spec"].get("networkPolicy", True) else []
    if trainings[0]["spec"].get("backend") == "pytorchjob":
        assert kinds == sorted(["PyTorchJob", *policy, *claim])
    else:
        assert kinds == sorted(["Job", "Service", *policy, *claim])


def test_root_sample_is_small_and_distributed() -> None:
    (doc,) = yaml.safe_load_all((ROOT / "petstraining.yaml").read_text())
    spec = api.resolve_spec(doc["spec"])
    assert spec.replicas == 2
    assert "synthetic" in spec.dataset and spec.pretrained is False
    assert spec.resources["gpu"] == 0


def test_render_rejects_bad_spec_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: training.pets.dev/v1alpha1\nkind: PetsTraining\n"
                   "metadata: {name: pets}\nspec: {replicas: -1}\n")
    assert cli.main(["render", "-f", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "spec.replicas" in err and "-1" in err
    bad.write_text("apiVersion: training.pets.dev/v1alpha1\nkind: PetsTraining\n"
                   "metadata: {name: 9lives}\nspec: {}\n")
    assert cli.main(["render", "-f", str(bad)]) == 2
    assert "metadata.name" in capsys.readouterr().err


def test_render_console_script_reads_stdin() -> None:
    exe = Path(sys.executable).with_name("pets-operator")
    out = subprocess.run([str(exe), "render", "-f", "-", "--namespace", "team-a"],
                         input=(ROOT / "petstraining.yaml").read_text(), capture_output=True, text=True,
                         check=True).stdout
    job = [d for d in yaml.safe_load_all(out) if d["kind"] == "Job"][0]
    assert job["metadata"]["namespace"] == "team-a"


def test_crd_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["crd"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["metadata"]["name"] == api.CRD_NAME


def test_run_flags() -> None:
    args = cli.build_parser().parse_args(
        ["run", "-n", "a", "--namespace", "b", "--liveness-port", "8081", "--metrics-port", "9100",
         "--standalone", "--log-format", "plain"])
    assert args.namespace == ["a", "b"] and args.liveness_port == 8081 and args.metrics_port == 9100
    assert args.standalone and args.log_format == "plain"
    defaults = cli.build_parser().parse_args(["run"])
    assert defaults.namespace == [] and defaults.peering == "pets-training" and not defaults.standalone
    assert defaults.log_format == "json"
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["run", "--peering", "x", "--standalone"])
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["run", "--metrics-port", "70000"])


def test_priority_auto_draws_a_number_per_replica(capsys: pytest.CaptureFixture[str]) -> None:
    parse = cli.build_parser().parse_args
    assert parse(["run", "--priority", "7"]).priority == 7
    assert parse(["run"]).priority == 0
    drawn = {parse(["run", "--priority", "auto"]).priority for _ in range(20)}
    low, high = cli.AUTO_PRIORITY_RANGE
    assert all(low <= p <= high for p in drawn) and len(drawn) > 1, drawn
    with pytest.raises(SystemExit):
        parse(["run", "--priority", "high"])
    assert "priority must be an integer or 'auto', got 'high'" in capsys.readouterr().err


def run_outside_a_cluster(
    home: Path, kubeconfig: Path
) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """`pets-operator run` with no in-cluster environment, HOME=home and KUBECONFIG=kubeconfig."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.update(HOME=str(home), KUBECONFIG=str(kubeconfig))
    exe = Path(sys.executable).with_name("pets-operator")
    return subprocess.run([str(exe), "run"], env=env, capture_output=True, text=True, timeout=60), env


def test_run_without_a_cluster_says_what_it_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`docker run` of the operator image outside a cluster: exit 2 and one line, not a traceback."""
    missing = tmp_path / "missing-kubeconfig"
    proc, env = run_outside_a_cluster(tmp_path, missing)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("pets-operator run: no cluster to connect to")
    assert "KUBERNETES_SERVICE_HOST is unset" in line and f"{missing} (from KUBECONFIG) not found" in line
    assert "set KUBECONFIG" in line

    env.pop("KUBECONFIG")
    monkeypatch.setenv("HOME", str(tmp_path))  # ~ in the default path
    assert "~/.kube/config (the default) not found" in (runner.missing_cluster(env) or "")
    assert runner.missing_cluster({**env, "KUBERNETES_SERVICE_HOST": "10.0.0.1"}) is None
    (tmp_path / "config").write_text("apiVersion: v1\nkind: Config\n")
    assert runner.missing_cluster({"KUBECONFIG": f"{missing}:{tmp_path / 'config'}"}) is None


def test_run_with_a_broken_kubeconfig_names_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "kubeconfig"
    broken.write_text("clusters: [\n")
    proc, _ = run_outside_a_cluster(tmp_path, broken)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"pets-operator run: cannot load cluster credentials: {broken} is not valid YAML" in proc.stderr


def test_trainer_accepts_the_generated_flags() -> None:
    from pets_training.config import build_parser  # the trainer's own parser: the contract's other side

    spec = api.resolve_spec({"pretrained": True, "freezeBackbone": False,
                             "dataset": {"synthetic": {"imagesPerClass": 3, "numClasses": 4}}})
    parsed = vars(build_parser().parse_args(builders.trainer_args(spec)))
    assert parsed["pretrained"] is True and parsed["unfreeze"] is True
    assert parsed["synthetic_images_per_class"] == 3 and parsed["synthetic_classes"] == 4
    assert parsed["summary_path"] == "/dev/termination-log" and parsed["metrics_port"] == 9090
    assert parsed["lr"] == 0.03 and parsed["epochs"] == 5 and parsed["mixed_precision"] == "auto"
    weights = api.resolve_spec({"weights": "/data/w.safetensors",
                                "dataset": {"hostPath": {"path": "/srv"}}})
    parsed = vars(build_parser().parse_args(builders.trainer_args(weights)))
    assert parsed["weights"] == "/data/w.safetensors" and parsed["data"] == "/data"
