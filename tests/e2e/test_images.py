"""The trainer and operator images, run with a real Docker engine (`make test-images`).

`make test-images` builds both images from a clean engine with the offline base first
(image/build.sh clean, then all); these tests then run real containers from them. An image or an
engine that is missing fails the test loudly with the command that fixes it; nothing here skips.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import yaml
from pets_operator.builders import RUN_AS

from pets_contract import __version__

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
VERSION = __version__
TRAINER = f"pets-training/trainer:{VERSION}"
OPERATOR = f"pets-training/operator:{VERSION}"
OPERATOR_MAX_BYTES = 300_000_000
# Small and fast, but the real recipe code path: a small timm model, three synthetic classes, one epoch,
# the default mixed precision (auto: on a CPU bf16 where it has bf16 instructions, else none).
RECIPE_FLAGS = [
    "--no-pretrained",  # no internet here: random init (the default, pretrained, needs the hub or a cache)
    "--model", "resnet18",
    "--image-size", "64",
    "--batch-size", "4",
    "--eval-batch-size", "8",
    "--epochs", "1",
]  # fmt: skip
FAST_FLAGS = [*RECIPE_FLAGS, "--synthetic-classes", "3", "--synthetic-images-per-class", "8"]
RUN_TIMEOUT = 900  # seconds; a tiny epoch takes well under a minute, the rest is starting torch


def docker(*args: str, timeout: float = RUN_TIMEOUT, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the docker CLI; on an unexpected failure the message carries its output."""
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(
            f"`docker {' '.join(args)}` exited {proc.returncode}\n"
            f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
        )
    return proc


def output(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout + proc.stderr


@pytest.fixture(scope="session")
def engine() -> None:
    proc = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        pytest.fail(f"no Docker engine answers ({proc.stderr.strip()}); run `image/build.sh engine`")


def image_config(tag: str) -> dict:
    proc = docker("image", "inspect", tag, check=False)
    if proc.returncode != 0:
        pytest.fail(f"image {tag} is missing: build it with `make images` (image/build.sh all)")
    return json.loads(proc.stdout)[0]


@pytest.fixture(scope="session")
def trainer(engine: None) -> dict:
    return image_config(TRAINER)


@pytest.fixture(scope="session")
def operator(engine: None) -> dict:
    return image_config(OPERATOR)


@pytest.fixture
def names() -> Iterator[list[str]]:
    """Container and network names a test creates; removed afterwards whatever happened."""
    created: list[str] = []
    yield created
    for name in reversed(created):
        if name.startswith("net:"):
            docker("network", "rm", name[4:], check=False)
        else:
            docker("rm", "-f", name, check=False)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def read_container_file(container: str, path: str) -> str:
    """A file from a (stopped) container, via `docker cp` to stdout (a tar stream)."""
    import io
    import tarfile

    proc = subprocess.run(["docker", "cp", f"{container}:{path}", "-"], capture_output=True, timeout=120)
    if proc.returncode != 0:
        pytest.fail(f"{container}:{path} is missing: {proc.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        member = tar.next()
        assert member is not None and member.isfile(), f"{container}:{path} is not a file"
        data = tar.extractfile(member)
        assert data is not None
        return data.read().decode()


def run_to_end(
    name: str, image: str, args: Sequence[str], docker_args: Sequence[str] = ()
) -> tuple[int, str]:
    """`docker run` (kept after it exits, for `docker cp`); returns the exit code and the logs."""
    docker("run", "--name", name, *docker_args, image, *args, check=False)
    code = int(docker("wait", name).stdout.strip())
    return code, output(docker("logs", name))


# ---------------------------------------------------------------- both images


@pytest.mark.parametrize("which", ["trainer", "operator"])
def test_image_is_labelled_non_root_and_has_no_build_tools(
    which: str, request: pytest.FixtureRequest
) -> None:
    config = request.getfixturevalue(which)
    tag = TRAINER if which == "trainer" else OPERATOR
    labels = config["Config"]["Labels"] or {}
    assert labels.get("org.opencontainers.image.version") == VERSION, labels
    for key in ("source", "revision"):
        assert labels.get(f"org.opencontainers.image.{key}"), f"{tag}: OCI label {key} is missing: {labels}"
    # The pods' uid (builders.RUN_AS): above every host user's, so a container escape is nobody's account.
    assert config["Config"]["User"] == f"{RUN_AS}:{RUN_AS}", config["Config"]["User"]
    # What the container really runs as, and what the build must not leave behind.
    probe = (
        "import importlib.util, os, shutil; "
        "print(os.getuid(), os.getgid()); "
        "print([m for m in ('pip', 'wheel') if importlib.util.find_spec(m)]); "
        "print([t for t in ('gcc', 'cc', 'make', 'pip', 'pip3') if shutil.which(t)]); "
        "print([p for p in ('/wheels', '/src', '/dist', '/approot', '/opt/pip-tool', '/root/.cache', "
        "'/home/pets/.cache', '/var/lib/apt/lists/partial') if os.path.exists(p) and os.listdir(p)])"
    )
    proc = docker("run", "--rm", "--entrypoint", "python3", tag, "-c", probe)
    uid_line, modules, tools, leftovers = proc.stdout.strip().splitlines()
    assert uid_line == f"{RUN_AS} {RUN_AS}", f"{tag} runs as uid/gid {uid_line}, not {RUN_AS} {RUN_AS}"
    assert modules == "[]", f"{tag} still has installers: {modules}"
    assert tools == "[]", f"{tag} still has build tools: {tools}"
    assert leftovers == "[]", f"{tag} still has build leftovers: {leftovers}"


# ---------------------------------------------------------------- operator


def test_operator_image_is_small(operator: dict) -> None:
    size = operator["Size"]
    limit = OPERATOR_MAX_BYTES / 1e6
    assert size < OPERATOR_MAX_BYTES, f"{OPERATOR} is {size / 1e6:.0f} MB, over {limit:.0f} MB"
    proc = docker("run", "--rm", "--entrypoint", "python3", OPERATOR, "-c", "import torch", check=False)
    assert proc.returncode != 0 and "No module named 'torch'" in proc.stderr, "the operator image holds torch"


def test_operator_help_runs(operator: dict) -> None:
    assert operator["Config"]["Entrypoint"] == ["pets-operator"]
    assert operator["Config"]["Cmd"] == ["run"]
    proc = docker("run", "--rm", OPERATOR, "--help")
    for command in ("run", "render", "crd"):
        assert command in proc.stdout, proc.stdout


def test_operator_outside_a_cluster_says_so(operator: dict) -> None:
    """`docker run` of the operator with no cluster: exit 2 and what it looked for, no traceback."""
    proc = docker("run", "--rm", OPERATOR, check=False)
    assert proc.returncode == 2, output(proc)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "no cluster to connect to" in proc.stderr and "KUBERNETES_SERVICE_HOST is unset" in proc.stderr


def test_operator_renders_the_sample(operator: dict) -> None:
    sample = REPO / "petstraining.yaml"
    # `docker run -i` with the sample on stdin: no bind mount, so no file permissions in the way.
    proc = subprocess.run(
        ["docker", "run", "--rm", "-i", OPERATOR, "render", "-f", "-", "--default-image", TRAINER],
        input=sample.read_text(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, output(proc)
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert "Service" in kinds and ("Job" in kinds or "PyTorchJob" in kinds), kinds
    job = next(d for d in docs if d["kind"] == "Job")
    assert job["spec"].get("completionMode") == "Indexed", job["spec"]
    images = {c["image"] for c in job["spec"]["template"]["spec"]["containers"]}
    assert images == {TRAINER}, images


# ---------------------------------------------------------------- trainer


def test_trainer_trains_standalone_on_synthetic_data(trainer: dict, names: list[str]) -> None:
    assert trainer["Config"]["Entrypoint"] == ["pets-launch"]
    name = unique("pets-standalone")
    names.append(name)
    code, logs = run_to_end(name, TRAINER, FAST_FLAGS)
    assert code == 0, f"the trainer exited {code}:\n{logs[-6000:]}"
    assert "one process in total" in logs, logs[-3000:]
    assert re.search(r"epoch 1/1", logs, re.IGNORECASE), f"no per-epoch line in the logs:\n{logs[-3000:]}"
    summary = json.loads(read_container_file(name, "/output/summary.json"))
    assert summary["status"] == "succeeded", summary
    assert summary["epochs"] == 1 and summary["world_size"] == 1, summary
    assert summary["num_classes"] == 3 and summary["model"] == "resnet18", summary
    assert 0.0 <= summary["final_accuracy"] <= 1.0, summary
    progress = read_container_file(name, "/output/progress.jsonl").splitlines()
    assert [json.loads(line)["epoch"] for line in progress] == [1], progress


def test_trainer_trains_on_a_mounted_image_directory(trainer: dict, names: list[str], tmp_path: Path) -> None:
    from PIL import Image

    data = tmp_path / "data"
    data.mkdir()
    colours = {"beagle": (200, 150, 90), "persian": (240, 240, 240), "pug": (60, 50, 40)}
    for label, colour in colours.items():
        for n in range(1, 7):
            image = Image.new("RGB", (80, 72), colour)
            image.putpixel((n, n), (n * 20, 0, 0))
            image.save(data / f"{label}_{n}.jpg", quality=90)
    data.chmod(0o755)
    name = unique("pets-data")
    names.append(name)
    code, logs = run_to_end(name, TRAINER, ["--data", "/data", *RECIPE_FLAGS], ["-v", f"{data}:/data:ro"])
    assert code == 0, f"the trainer exited {code}:\n{logs[-6000:]}"
    summary = json.loads(read_container_file(name, "/output/summary.json"))
    assert summary["status"] == "succeeded" and summary["num_classes"] == 3, summary


def test_two_containers_train_one_model(trainer: dict, names: list[str]) -> None:
    """Machine 0 and machine 1 on a user-defined network, given the pod contract's environment."""
    network = unique("pets-net")
    docker("network", "create", network)
    names.append(f"net:{network}")
    main = unique("pets-machine")
    containers = [main, main.replace("machine", "worker")]
    for rank, name in enumerate(containers):
        names.append(name)
        env = {
            "JOB_COMPLETION_INDEX": str(rank),
            "PETS_NUM_MACHINES": "2",
            "PETS_PROCS_PER_MACHINE": "1",
            "PETS_MAIN_ADDR": main,
            "PETS_MAIN_PORT": "29500",
            "PETS_RESOLVE_TIMEOUT": "120",
            "PETS_CPU_LIMIT": "1",
        }
        env_args = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
        docker("run", "-d", "--name", name, "--network", network, *env_args, TRAINER, *FAST_FLAGS)
    codes = [int(docker("wait", name).stdout.strip()) for name in containers]
    logs = [output(docker("logs", name)) for name in containers]
    for rank, (code, log) in enumerate(zip(codes, logs, strict=True)):
        assert code == 0, f"machine {rank} exited {code}:\n{log[-6000:]}"
        assert f"machine {rank} of 2" in log, f"machine {rank} did not launch as rank {rank}:\n{log[-3000:]}"
    assert "2 process(es)" in logs[0], f"rank 0 does not report world size 2:\n{logs[0][-3000:]}"
    summary = json.loads(read_container_file(main, "/output/summary.json"))
    assert summary["status"] == "succeeded" and summary["world_size"] == 2, summary


def test_trainer_help_lists_the_flags(trainer: dict) -> None:
    proc = docker("run", "--rm", TRAINER, "--help", timeout=300)
    for flag in ("--data", "--epochs", "--model", "--output-dir"):
        assert flag in proc.stdout, proc.stdout[-3000:]


def test_bad_argument_fails_clearly(trainer: dict) -> None:
    proc = docker("run", "--rm", TRAINER, "--epochs", "zero", check=False, timeout=300)
    assert proc.returncode != 0, output(proc)
    assert "--epochs" in proc.stderr and "'zero'" in proc.stderr, proc.stderr[-2000:]
    proc = docker("run", "--rm", TRAINER, "--epochs", "0", check=False, timeout=300)
    assert proc.returncode == 78, output(proc)  # a bad flag is permanent (docs/contract.md#exit-codes)
    assert "epochs must be at least 1, got 0" in output(proc), output(proc)[-2000:]


def test_standalone_default_without_the_hub_says_what_to_do(trainer: dict, names: list[str]) -> None:
    """The default is the tutorial's pretrained resnet50d. With no hub (HF_ENDPOINT at a closed port in
    the container, so this holds on machines with internet too) it fails at once, permanently, in one
    line naming the three ways out."""
    name = unique("pets-no-hub")
    names.append(name)
    flags = ["--epochs", "1", "--image-size", "64", "--synthetic-classes", "3",
             "--synthetic-images-per-class", "8"]
    code, logs = run_to_end(name, TRAINER, flags, ["-e", "HF_ENDPOINT=http://127.0.0.1:9"])
    assert code == 78, f"exit {code}:\n{logs[-4000:]}"
    summary = json.loads(read_container_file(name, "/output/summary.json"))
    error = summary["error"]
    assert "\n" not in error, error
    for way_out in ("--pretrained-cache", "--weights", "--no-pretrained", "timm/resnet50d.ra2_in1k"):
        assert way_out in error, error
