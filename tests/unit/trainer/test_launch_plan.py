import logging

import pytest

from pets_training.launch import (
    LaunchError,
    accelerate_command,
    child_command,
    plan_from_env,
    trainer_args,
    wait_for_address,
)

pytestmark = pytest.mark.unit


def test_defaults_are_one_machine_one_process() -> None:
    plan = plan_from_env({})
    assert (plan.machine_rank, plan.num_machines, plan.procs_per_machine, plan.total_processes) == (
        0,
        1,
        1,
        1,
    )
    assert (plan.main_addr, plan.main_port, plan.mixed_precision, plan.resolve_timeout) == (
        "127.0.0.1",
        29500,
        "auto",
        300.0,
    )


def test_indexed_job_environment() -> None:
    plan = plan_from_env(
        {
            "JOB_COMPLETION_INDEX": "2",
            "RANK": "9",
            "PETS_NUM_MACHINES": "3",
            "PETS_PROCS_PER_MACHINE": "4",
            "PETS_MAIN_ADDR": "pets-0.pets.ns.svc.cluster.local",
            "PETS_MAIN_PORT": "29600",
        },
        ["--epochs", "1", "--mixed-precision", "bf16"],
    )
    assert (plan.machine_rank, plan.num_machines, plan.total_processes) == (2, 3, 12)
    assert plan.main_addr == "pets-0.pets.ns.svc.cluster.local" and plan.main_port == 29600
    assert plan.mixed_precision == "bf16"


def test_pytorchjob_environment_falls_back_to_torch_names() -> None:
    plan = plan_from_env(
        {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"}
    )
    assert (plan.machine_rank, plan.num_machines, plan.main_addr, plan.main_port) == (
        1,
        2,
        "job-master-0",
        23456,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"JOB_COMPLETION_INDEX": "x"}, "JOB_COMPLETION_INDEX must be an integer, got 'x'"),
        (
            {"JOB_COMPLETION_INDEX": "2", "PETS_NUM_MACHINES": "2"},
            "machine rank 2 .* below PETS_NUM_MACHINES=2",
        ),
        ({"PETS_NUM_MACHINES": "0"}, "PETS_NUM_MACHINES must be at least 1, got 0"),
        ({"PETS_MAIN_PORT": "99999"}, "PETS_MAIN_PORT must be a TCP port"),
        ({"PETS_RESOLVE_TIMEOUT": "soon"}, "PETS_RESOLVE_TIMEOUT must be a number of seconds, got 'soon'"),
    ],
)
def test_bad_environment_names_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        plan_from_env(env)


@pytest.mark.parametrize(
    ("args", "precision"),
    [
        ([], "auto"),
        (["--mixed-precision", "bf16"], "bf16"),
        (["--mixed-precision=no", "--epochs", "1"], "no"),
        (["--mixed-precision", "no", "--mixed-precision", "bf16"], "bf16"),  # the last wins, as in argparse
    ],
)
def test_mixed_precision_comes_from_the_trainer_flag(args: list[str], precision: str) -> None:
    assert plan_from_env({}, args).mixed_precision == precision
    assert plan_from_env({"PETS_MIXED_PRECISION": "bf16"}, args).mixed_precision == precision  # not a channel


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mixed-precision", "fp8"], "--mixed-precision must be one of auto, no, fp16, bf16, got 'fp8'"),
        (["--mixed-precision=FP16"], "--mixed-precision must be one of auto, no, fp16, bf16, got 'FP16'"),
        (["--mixed-precision"], "--mixed-precision must be one of auto, no, fp16, bf16, got ''"),
    ],
)
def test_bad_mixed_precision_flag_names_the_flag(args: list[str], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        plan_from_env({}, args)


def test_launcher_always_resumes() -> None:
    assert trainer_args(["--data", "/data"]) == ["--data", "/data", "--resume"]
    assert trainer_args(["--resume"]) == ["--resume"]


def test_accelerate_command_carries_the_plan() -> None:
    plan = plan_from_env(
        {
            "JOB_COMPLETION_INDEX": "1",
            "PETS_NUM_MACHINES": "2",
            "PETS_PROCS_PER_MACHINE": "2",
            "PETS_MAIN_ADDR": "main",
            "PETS_MAIN_PORT": "1234",
        }
    )
    cmd = accelerate_command(plan, ["--epochs", "1", "--resume"], threads=3)
    joined = " ".join(cmd)
    for part in (
        "--num_machines 2",
        "--machine_rank 1",
        "--main_process_ip main",
        "--main_process_port 1234",
        "--num_processes 4",
        "--mixed_precision no",  # accelerate knows no auto: the trainer's flag, added, decides
        "--num_cpu_threads_per_process 3",
        "-m pets_training --epochs 1 --resume --mixed-precision auto",
    ):
        assert part in joined
    fp16 = ["--mixed-precision=fp16"]
    given = " ".join(accelerate_command(plan_from_env({}, fp16), fp16, threads=1))
    assert "--mixed_precision fp16" in given and given.endswith("-m pets_training --mixed-precision=fp16")


def test_the_child_imports_before_it_waits_then_runs_the_same_accelerate_launch() -> None:
    plan = plan_from_env(
        {"JOB_COMPLETION_INDEX": "1", "PETS_NUM_MACHINES": "2", "PETS_MAIN_ADDR": "main",
         "PETS_RESOLVE_TIMEOUT": "30"}
    )  # fmt: skip
    command = accelerate_command(plan, ["--epochs", "1"], threads=1)
    child = child_command(plan, command)
    assert child[1:5] == ["-m", "pets_training.accelerate_launch", "main", "30"]
    assert child[5:] == command[3:]  # accelerate launch's own arguments, unchanged
    with pytest.raises(ValueError):
        child_command(plan, ["python", "-m", "torch.distributed.run"])


def test_wait_for_address_logs_how_long_a_late_name_took(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    answers = iter([OSError("not yet"), "10.0.0.1"])

    def later(host: str) -> object:
        answer = next(answers)
        if isinstance(answer, OSError):
            raise answer
        return answer

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with caplog.at_level(logging.INFO, logger="pets_training.launch"):
        wait_for_address("pets-0.pets", 12, resolve=later, clock=lambda: now[0], sleep=sleep)
    assert "pets-0.pets resolved after 0.5 s" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pets_training.launch"):
        wait_for_address("localhost", 5)
    assert "resolved after" not in caplog.text  # at once: nothing to say


def test_wait_for_address_is_bounded_and_says_what_to_check() -> None:
    now = [0.0]
    calls: list[str] = []

    def unresolvable(host: str) -> object:
        calls.append(host)
        raise OSError("Name or service not known")

    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    with pytest.raises(LaunchError, match=r"'pets-0.pets' did not resolve within 12 s .*headless Service"):
        wait_for_address("pets-0.pets", 12, resolve=unresolvable, clock=lambda: now[0], sleep=sleep)
    assert now[0] == pytest.approx(12.0)
    assert sleeps[:3] == [0.5, 1.0, 1.0] and max(sleeps) == 1.0  # capped at 1 s: CoreDNS negative cache
    assert len(calls) == len(sleeps) + 1 == 14  # 0.5 s, 11 x 1 s, the last 0.5 s to the deadline

    answers = iter([OSError("not yet"), OSError("not yet"), "10.0.0.1"])

    def later(host: str) -> object:
        answer = next(answers)
        if isinstance(answer, OSError):
            raise answer
        return answer

    wait_for_address("pets-0.pets", 12, resolve=later, clock=lambda: now[0], sleep=sleep)


def test_localhost_resolves_for_real() -> None:
    wait_for_address("localhost", 5)
