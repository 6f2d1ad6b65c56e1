"""Exit codes (docs/contract.md): 78 for a failure no restart can fix, through `pets-train`, the one-process
`pets-launch` and a real 2-process `accelerate launch`; 1 for other failures; signals forwarded."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pets_contract import exits
from pets_contract.env import EXIT_CODE_FILE
from pets_contract.gauges import TIME_PARTS, TIME_SHARES
from pets_training import cli, contract, launch

from .helpers import BIN, PYTHON, free_port, read_json

pytestmark = pytest.mark.unit

# the smallest settings that get through setup quickly
TINY_ARGS = [
    "--model", "resnet10t",
    "--image-size", "32",
    "--synthetic-classes", "2",
    "--synthetic-images-per-class", "8",
    "--epochs", "1",
    "--batch-size", "4",
    "--eval-batch-size", "8",
    "--mixed-precision", "no",
    "--num-workers", "0",
    "--threads", "1",
    "--no-pretrained",
]  # fmt: skip


def _with(args: list[str], **flags: str) -> list[str]:
    out = list(args)
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


def _train(args: list[str], tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != EXIT_CODE_FILE}
    return subprocess.run(
        [str(BIN / "pets-train"), *args, "--output-dir", str(tmp_path / "out"), "--summary-path",
         str(tmp_path / "termination-log")],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.mark.timeout(150)
def test_an_unknown_model_exits_78_with_the_model_in_the_summary(tmp_path: Path) -> None:
    proc = _train(_with(TINY_ARGS, model="resnet9000"), tmp_path)
    assert proc.returncode == exits.PERMANENT == 78, proc.stderr[-3000:]
    summary = read_json(tmp_path / "termination-log")
    assert summary["status"] == "failed" and "model: 'resnet9000' is not a timm model" in summary["error"]
    assert "\n" not in summary["error"]
    assert read_json(tmp_path / "out" / "summary.json") == summary


@pytest.mark.timeout(150)
def test_an_empty_data_directory_exits_78(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    proc = _train(_with(TINY_ARGS, data=str(tmp_path / "empty")), tmp_path)
    assert proc.returncode == 78, proc.stderr[-3000:]
    assert read_json(tmp_path / "termination-log") == {
        "status": "failed",
        "error": f"data: directory {str(tmp_path / 'empty')!r} is empty",
    }


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--epochs", "three"], "argument --epochs: invalid int value: 'three'"),
        (["--epochs", "0"], "epochs must be at least 1, got 0"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_a_bad_flag_exits_78(
    tmp_path: Path, flags: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    code_file = tmp_path / "codes"
    monkeypatch.setenv(EXIT_CODE_FILE, str(code_file))
    code = cli.main([*flags, "--summary-path", str(tmp_path / "termination-log")])
    assert code == 78
    assert message in read_json(tmp_path / "termination-log")["error"]
    assert code_file.read_text() == "78\n"


def test_a_crash_still_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pets_training import train

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(train, "training_function", crash)
    code_file = tmp_path / "codes"
    monkeypatch.setenv(EXIT_CODE_FILE, str(code_file))
    code = cli.main([*TINY_ARGS, "--summary-path", str(tmp_path / "termination-log")])
    assert code == exits.FAILURE == 1
    assert read_json(tmp_path / "termination-log") == {
        "status": "failed",
        "error": "RuntimeError: CUDA error: an illegal memory access was encountered",
    }
    assert code_file.read_text() == "1\n"  # the launcher only turns a 78 into 78


# pets-train whose second epoch crashes before its first step: the first one took 8 steps (2 x 20 images ->
# 32 for training, batch 4).
CRASH_IN_EPOCH_2 = """
import sys
from pets_training import cli, train

real = train.run_epoch

def run_epoch(t, cfg, state, epoch, *rest):
    if epoch == 1:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    return real(t, cfg, state, epoch, *rest)

train.run_epoch = run_epoch
raise SystemExit(cli.main(sys.argv[1:]))
"""


@pytest.mark.timeout(150)
def test_a_crash_mid_run_says_the_step_it_reached(tmp_path: Path) -> None:
    """The failure summary carries the global step the run reached (the operator's exact lastStep); a
    failure before the training loop (above) knows none."""
    env = {k: v for k, v in os.environ.items() if k != EXIT_CODE_FILE}
    args = [*_with(TINY_ARGS, epochs="2", synthetic_images_per_class="20"),
            "--output-dir", str(tmp_path / "out"), "--summary-path", str(tmp_path / "termination-log")]
    proc = subprocess.run([PYTHON, "-c", CRASH_IN_EPOCH_2, *args], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == exits.FAILURE, proc.stderr[-3000:]
    summary = read_json(tmp_path / "termination-log")
    split = summary.pop("time_seconds")  # the failed run's time split too: the operator books it
    assert summary == {"status": "failed", "global_step": 8,
                       "error": "RuntimeError: CUDA error: an illegal memory access was encountered"}
    assert set(split) == {*TIME_PARTS, *TIME_SHARES} and split["train"] > 0 and split["eval"] > 0, split
    summary["time_seconds"] = split
    assert read_json(tmp_path / "out" / "summary.json") == summary


def test_an_unreachable_hub_is_permanent_and_a_server_error_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    from pets_training import hubcache, model

    monkeypatch.setattr(hubcache, "unreachable", lambda source, timeout: None)  # the HEAD got an answer

    def fail_with(err: Exception) -> None:
        monkeypatch.setattr(model.timm, "create_model", lambda *a, **k: (_ for _ in ()).throw(err))

    fail_with(RuntimeError("503 Server Error: Service Unavailable"))
    with pytest.raises(model.ModelDownloadError, match=r"pretrained: downloading resnet10t weights"):
        model.create_model("resnet10t", 2, pretrained=True)
    assert not issubclass(model.ModelDownloadError, contract.PermanentError)  # exit 1: a restart may help

    try:
        raise OSError("cannot find the requested files") from ConnectionRefusedError(111, "refused")
    except OSError as err:
        fail_with(err)  # a network failure in the middle of the download: permanent, the one-line message
    with pytest.raises(model.HubUnreachableError, match=r"cannot reach the Hugging Face hub"):
        model.create_model("resnet10t", 2, pretrained=True)
    assert issubclass(model.HubUnreachableError, contract.PermanentError)


def _code_writer(code: int, exit_with: int) -> list[str]:
    """A stand-in for `accelerate launch`: reports ``code`` like a training process, then exits."""
    script = (
        "import os, sys; "
        f"open(os.environ[{EXIT_CODE_FILE!r}], 'a').write('{code}\\n') if {code} else None; "
        f"sys.exit({exit_with})"
    )
    return [PYTHON, "-c", script]


@pytest.mark.parametrize(
    ("reported", "child_exit", "expected"),
    # 75: every rank stopped on SIGTERM after a checkpoint (torchrun, signalled itself, exits 1)
    [(78, 1, 78), (1, 1, 1), (0, 0, 0), (0, 3, 3), (0, -9, 137), (75, 1, 75)],
)
def test_the_launcher_turns_a_reported_78_into_its_exit_code(
    reported: int, child_exit: int, expected: int
) -> None:
    command = _code_writer(reported, child_exit)
    if child_exit < 0:
        command = [PYTHON, "-c", f"import os, signal; os.kill(os.getpid(), {-child_exit})"]
    assert launch.launch_accelerate(command, os.environ) == expected


LAUNCHER = """
import logging, os, sys
logging.basicConfig(level=logging.INFO)
from pets_training.launch import launch_accelerate
child = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"]
sys.exit(launch_accelerate(child, os.environ))
"""


@pytest.mark.timeout(60)
def test_the_launcher_forwards_sigterm_to_accelerate() -> None:
    proc = subprocess.Popen(
        [PYTHON, "-c", LAUNCHER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)  # (the bound on a launcher that kept waiting: no timing)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert f"got signal {int(signal.SIGTERM)}: passing it to accelerate launch" in err


def test_the_launcher_stops_on_sigterm_while_it_waits_for_the_main_address() -> None:
    """As a pod's PID 1 the launcher would ignore SIGTERM without a handler (the kernel spares PID 1
    from signals it does not handle); it must exit 143 at once, not at the grace period's SIGKILL."""
    env = {**os.environ, "PETS_NUM_MACHINES": "2", "JOB_COMPLETION_INDEX": "1",
           "PETS_MAIN_ADDR": "pets-0.nowhere.invalid", "PETS_RESOLVE_TIMEOUT": "120"}
    proc = subprocess.Popen([str(BIN / "pets-launch"), "--epochs", "1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        while "waiting" not in proc.stderr.readline() and time.monotonic() < deadline:
            pass
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err


@pytest.mark.timeout(90)
def test_a_main_address_that_never_resolves_makes_pets_launch_exit_2() -> None:
    env = {**os.environ, "PETS_NUM_MACHINES": "2", "JOB_COMPLETION_INDEX": "1",
           "PETS_MAIN_ADDR": "pets-0.nowhere.invalid", "PETS_RESOLVE_TIMEOUT": "1"}
    proc = subprocess.run([str(BIN / "pets-launch"), "--epochs", "1"], env=env,
                          capture_output=True, text=True, timeout=80)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "'pets-0.nowhere.invalid' did not resolve within 1 s (PETS_RESOLVE_TIMEOUT)" in proc.stderr
    # the child imported accelerate (and torch) before its first lookup: see accelerate_launch
    assert proc.stderr.index("accelerate launch imported") < proc.stderr.index("waiting for")


@pytest.mark.timeout(300)
def test_two_processes_failing_permanently_make_pets_launch_exit_78(tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if k != EXIT_CODE_FILE},
        "PETS_PROCS_PER_MACHINE": "2",
        "PETS_MAIN_ADDR": "127.0.0.1",
        "PETS_MAIN_PORT": str(free_port()),
        "PETS_CPU_LIMIT": "2",
        "PETS_OUTPUT_DIR": str(tmp_path / "out"),
    }
    args = [*_with(TINY_ARGS, model="resnet9000"), "--summary-path", str(tmp_path / "termination-log")]
    proc = subprocess.run(
        [str(BIN / "pets-launch"), *args], env=env, capture_output=True, text=True, timeout=280
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 78, output[-6000:]
    assert "accelerate.commands.launch" in output  # really the 2-process path
    assert "a training process failed permanently" in output
    summary = read_json(tmp_path / "termination-log")
    assert summary["status"] == "failed" and "'resnet9000' is not a timm model" in summary["error"]


@pytest.mark.timeout(150)
def test_the_one_process_launcher_exits_78_itself(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != EXIT_CODE_FILE}
    env["PETS_OUTPUT_DIR"] = str(tmp_path / "out")
    proc = subprocess.run(
        [str(BIN / "pets-launch"), *_with(TINY_ARGS, model="resnet9000")],
        env=env, capture_output=True, text=True, timeout=140,
    )  # fmt: skip
    assert proc.returncode == 78, proc.stderr[-3000:]
    assert "one process in total" in proc.stderr


def test_exit_status_of_a_signal_death() -> None:
    assert launch.exit_status(-signal.SIGTERM) == 143 and launch.exit_status(78) == 78
