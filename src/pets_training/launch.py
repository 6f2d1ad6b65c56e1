"""``pets-launch``: the pod launcher (the trainer image's ENTRYPOINT).

Reads the pod contract from the environment (docs/contract.md), waits (bounded) for the main address
to resolve, then replaces itself with ``accelerate launch ... -m pets_training <args> --resume``; with
one process in total it trains in this process (no launcher needed). Arguments are trainer flags.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

log = logging.getLogger("pets_training.launch")

MIXED_PRECISION = ("no", "fp16", "bf16")


class LaunchError(ValueError):
    """A bad pod environment; the message names the variable and its value."""


@dataclass(frozen=True)
class LaunchPlan:
    machine_rank: int
    num_machines: int
    procs_per_machine: int
    main_addr: str
    main_port: int
    mixed_precision: str
    resolve_timeout: float

    @property
    def total_processes(self) -> int:
        return self.num_machines * self.procs_per_machine


def _int(env: Mapping[str, str], names: Sequence[str], default: int, minimum: int) -> int:
    for name in names:
        raw = env.get(name, "").strip()
        if raw:
            try:
                value = int(raw)
            except ValueError:
                raise LaunchError(f"{name} must be an integer, got {raw!r}") from None
            if value < minimum:
                raise LaunchError(f"{name} must be at least {minimum}, got {value}")
            return value
    return default


def _str(env: Mapping[str, str], names: Sequence[str], default: str) -> str:
    for name in names:
        raw = env.get(name, "").strip()
        if raw:
            return raw
    return default


def plan_from_env(env: Mapping[str, str]) -> LaunchPlan:
    """The pod contract -> a launch plan. Pure; errors name the variable and the value."""
    rank = _int(env, ["JOB_COMPLETION_INDEX", "RANK"], 0, 0)
    machines = _int(env, ["PETS_NUM_MACHINES", "WORLD_SIZE"], 1, 1)
    if rank >= machines:
        raise LaunchError(
            f"machine rank {rank} (JOB_COMPLETION_INDEX/RANK) must be below PETS_NUM_MACHINES={machines}"
        )
    port = _int(env, ["PETS_MAIN_PORT", "MASTER_PORT"], 29500, 1)
    if port > 65535:
        raise LaunchError(f"PETS_MAIN_PORT must be a TCP port (1-65535), got {port}")
    precision = _str(env, ["PETS_MIXED_PRECISION"], "fp16")
    if precision not in MIXED_PRECISION:
        raise LaunchError(
            f"PETS_MIXED_PRECISION must be one of {', '.join(MIXED_PRECISION)}, got {precision!r}"
        )
    raw_timeout = _str(env, ["PETS_RESOLVE_TIMEOUT"], "300")
    try:
        timeout = float(raw_timeout)
    except ValueError:
        raise LaunchError(f"PETS_RESOLVE_TIMEOUT must be a number of seconds, got {raw_timeout!r}") from None
    if timeout < 0:
        raise LaunchError(f"PETS_RESOLVE_TIMEOUT must be 0 or more, got {raw_timeout!r}")
    return LaunchPlan(
        machine_rank=rank,
        num_machines=machines,
        procs_per_machine=_int(env, ["PETS_PROCS_PER_MACHINE"], 1, 1),
        main_addr=_str(env, ["PETS_MAIN_ADDR", "MASTER_ADDR"], "127.0.0.1"),
        main_port=port,
        mixed_precision=precision,
        resolve_timeout=timeout,
    )


def trainer_args(args: Sequence[str]) -> list[str]:
    """The container args, plus ``--resume`` (a restarted gang continues from its newest checkpoint)."""
    out = list(args)
    if "--resume" not in out and "--no-resume" not in out:
        out.append("--resume")
    return out


def accelerate_command(plan: LaunchPlan, args: Sequence[str], threads: int) -> list[str]:
    """``accelerate launch`` for a multi-process plan.

    accelerate's ``--cpu`` with several processes needs an MPI launcher; ``--multi_gpu`` uses torchrun, and
    on a machine without a GPU the trainer then picks the CPU and the gloo backend itself.
    """
    return [
        sys.executable, "-m", "accelerate.commands.launch",
        "--multi_gpu",
        "--num_machines", str(plan.num_machines),
        "--machine_rank", str(plan.machine_rank),
        "--main_process_ip", plan.main_addr,
        "--main_process_port", str(plan.main_port),
        "--num_processes", str(plan.total_processes),
        "--mixed_precision", plan.mixed_precision,
        "--dynamo_backend", "no",
        "--num_cpu_threads_per_process", str(threads),
        "--max_restarts", "0",
        "-m", "pets_training",
        *args,
    ]  # fmt: skip


def wait_for_address(
    host: str,
    timeout: float,
    resolve: Callable[[str], object] = socket.gethostbyname,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Wait until ``host`` resolves (a headless Service publishes a pod's name only once the pod exists).

    DNS offers nothing to watch, so this polls with backoff (0.5 s, then every 1 s) up to ``timeout``. The cap
    is short because CoreDNS caches the negative answer for a few seconds anyway: a longer sleep only adds
    to the time this machine starts after pod 0 is published.
    """
    start = clock()
    deadline = start + timeout
    delay = 0.5
    next_report = start
    while True:
        try:
            resolve(host)
            return
        except OSError as err:
            if clock() >= deadline:
                raise LaunchError(
                    f"PETS_MAIN_ADDR {host!r} did not resolve within {timeout:g} s (PETS_RESOLVE_TIMEOUT): "
                    f"{err}. Check that the headless Service exists and publishes not-ready addresses, and "
                    "that pod 0 is scheduled."
                ) from None
            if clock() >= next_report:  # a line every 10 s, not one per lookup
                log.info("waiting for %s to resolve (%s; %.0f s so far)", host, err, clock() - start)
                next_report += 10.0
            sleep(min(delay, max(0.0, deadline - clock())))
            delay = min(delay * 2, 1.0)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        format="%(asctime)s %(levelname)s [launch] %(message)s", datefmt="%H:%M:%S", level=logging.INFO
    )
    args = trainer_args(sys.argv[1:] if argv is None else argv)
    try:
        plan = plan_from_env(os.environ)
    except LaunchError as err:
        log.error("%s", err)
        return 2
    os.environ["ACCELERATE_MIXED_PRECISION"] = plan.mixed_precision
    if plan.total_processes == 1:
        log.info("one process in total: training in this process")
        from .cli import main as train_main

        return train_main(args)

    from .resources import cpu_limit, plan_cpu

    try:
        wait_for_address(plan.main_addr, plan.resolve_timeout)
    except LaunchError as err:
        log.error("%s", err)
        return 2
    threads = plan_cpu(cpu_limit().cpus, plan.procs_per_machine).threads
    command = accelerate_command(plan, args, threads)
    log.info("machine %d of %d: %s", plan.machine_rank, plan.num_machines, " ".join(command))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command[0], command)
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
