"""``pets-launch``: the pod launcher (the trainer image's ENTRYPOINT).

Reads the pod contract from the environment (docs/contract.md, :mod:`.contract`) and the mixed precision
from the trainer flags, then runs ``accelerate launch ... -m pets_training <args> --resume`` as its child
(forwarding SIGTERM and SIGINT to it) through :mod:`.accelerate_launch`, which imports accelerate and torch
first and only then waits (bounded) for the main address to resolve: a lookup made before pod 0 is
published would be answered from CoreDNS's negative cache for seconds after it is (docs/trainer.md,
"Start-up: where the time goes"). With one process in total it trains in this process (no launcher
needed). Arguments are trainer flags.

Exit codes (docs/contract.md): 2 for a bad pod environment or flag, or a main address that did not resolve
in time; 78 (``exits.PERMANENT``) when any local training process failed permanently (they append their
exit codes to ``$PETS_EXIT_CODE_FILE``, which this sets: torchrun exits 1 whatever its workers did); 75
(``exits.STOPPED``) when every process that reported one stopped on SIGTERM after a checkpoint; else
accelerate's own exit code (128+N for a death by signal N).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from pets_contract import exits
from pets_contract.env import (
    ACCELERATE_MIXED_PRECISION,
    EXIT_CODE_FILE,
    JOB_COMPLETION_INDEX,
    MAIN_ADDR,
    NUM_MACHINES,
    RANK,
    RESOLVE_TIMEOUT,
)

from .config import MIXED_PRECISION_CHOICES
from .contract import ContractError, PodContract, mark_process_start

log = logging.getLogger("pets_training.launch")

LaunchError = ContractError  # a bad pod environment or flag; the message names it and its value

MIXED_PRECISION_FLAG = "--mixed-precision"


@dataclass(frozen=True)
class LaunchPlan(PodContract):
    """The pod contract plus what the launcher takes from the trainer flags."""

    mixed_precision: str = "auto"


def mixed_precision_flag(args: Sequence[str]) -> str:
    """The trainer's ``--mixed-precision X`` (or ``=X``; the last one wins, as in argparse), default auto.

    ``accelerate launch`` needs it too: its ``--mixed_precision`` is the precision of every process."""
    value = "auto"
    for i, arg in enumerate(args):
        if arg == MIXED_PRECISION_FLAG:
            value = args[i + 1] if i + 1 < len(args) else ""
        elif arg.startswith(MIXED_PRECISION_FLAG + "="):
            value = arg.split("=", 1)[1]
    if value not in MIXED_PRECISION_CHOICES:
        raise LaunchError(
            f"{MIXED_PRECISION_FLAG} must be one of {', '.join(MIXED_PRECISION_CHOICES)}, got {value!r}"
        )
    return value


def plan_from_env(env: Mapping[str, str], args: Sequence[str] = ()) -> LaunchPlan:
    """The pod contract and the trainer flags -> a launch plan. Pure; errors name the variable (or flag)
    and the value."""
    pod = PodContract.from_env(env)
    if pod.machine_rank >= pod.num_machines:
        raise LaunchError(
            f"machine rank {pod.machine_rank} ({JOB_COMPLETION_INDEX}/{RANK}) must be below "
            f"{NUM_MACHINES}={pod.num_machines}"
        )
    return LaunchPlan(**dataclasses.asdict(pod), mixed_precision=mixed_precision_flag(args))


def accelerate_precision(precision: str) -> str:
    """What ``accelerate launch --mixed_precision`` (and ``ACCELERATE_MIXED_PRECISION``) gets: it knows no
    auto, which the trainer resolves itself from its own flag (:func:`with_precision_flag`)."""
    return "no" if precision == "auto" else precision


def with_precision_flag(args: Sequence[str], precision: str) -> list[str]:
    """``args`` with ``--mixed-precision``, added when absent: the trainer's flag wins over accelerate's."""
    given = any(arg == MIXED_PRECISION_FLAG or arg.startswith(MIXED_PRECISION_FLAG + "=") for arg in args)
    return [*args] if given else [*args, MIXED_PRECISION_FLAG, precision]


def trainer_args(args: Sequence[str]) -> list[str]:
    """The container args, plus ``--resume`` (a restarted gang continues from its newest checkpoint)."""
    return [*args] if "--resume" in args or "--no-resume" in args else [*args, "--resume"]


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
        "--mixed_precision", accelerate_precision(plan.mixed_precision),
        "--dynamo_backend", "no",
        "--num_cpu_threads_per_process", str(threads),
        "--max_restarts", "0",
        "-m", "pets_training",
        *with_precision_flag(args, plan.mixed_precision),
    ]  # fmt: skip


def child_command(plan: LaunchPlan, command: Sequence[str]) -> list[str]:
    """``command`` (:func:`accelerate_command`) run by :mod:`.accelerate_launch`: the same ``accelerate
    launch``, started at once but only after its imports does it wait for the main address."""
    prefix = [sys.executable, "-m", "accelerate.commands.launch"]
    if list(command[:3]) != prefix:
        raise ValueError(f"not an accelerate launch command: {command[:3]}")
    return [
        sys.executable, "-m", "pets_training.accelerate_launch",
        plan.main_addr, f"{plan.resolve_timeout:g}",
        *command[3:],
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
    failed = False
    while True:
        try:
            resolve(host)
            if failed:
                log.info("%s resolved after %.1f s", host, clock() - start)
            return
        except OSError as err:
            failed = True
            if clock() >= deadline:
                raise LaunchError(
                    f"{MAIN_ADDR} {host!r} did not resolve within {timeout:g} s ({RESOLVE_TIMEOUT}): "
                    f"{err}. Check that the headless Service exists and publishes not-ready addresses, and "
                    "that pod 0 is scheduled."
                ) from None
            if clock() >= next_report:  # a line every 10 s, not one per lookup
                log.info("waiting for %s to resolve (%s; %.0f s so far)", host, err, clock() - start)
                next_report += 10.0
            sleep(min(delay, max(0.0, deadline - clock())))
            delay = min(delay * 2, 1.0)


FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_status(returncode: int) -> int:
    """A Popen return code as a shell would report it: a death by signal N (-N) becomes 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def reported_codes(path: Path) -> list[int]:
    """The exit codes the training processes appended to ``path`` (missing file: none)."""
    try:
        text = path.read_text()
    except OSError:
        return []
    return [int(line) for line in text.split() if line.strip().lstrip("-").isdigit()]


def run_child(command: Sequence[str], env: Mapping[str, str]) -> int:
    """Run ``command`` with inherited stdout/stderr, forwarding SIGTERM/SIGINT to it (pod deletion stops
    training promptly); returns its exit status."""
    child = subprocess.Popen(list(command), env=dict(env))

    def forward(signum: int, _frame: object) -> None:
        log.info("got signal %d: passing it to accelerate launch (pid %d)", signum, child.pid)
        with contextlib.suppress(OSError):  # already gone
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        return exit_status(child.wait())  # a wait the handler interrupts is retried (PEP 475)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def launch_accelerate(command: Sequence[str], env: Mapping[str, str]) -> int:
    """Run ``accelerate launch``; 78 when any local training process reported a permanent failure, else
    accelerate's exit status."""
    scratch = Path(tempfile.mkdtemp(prefix="pets-launch-"))
    code_file = scratch / "exit-codes"
    try:
        status = run_child(command, {**env, EXIT_CODE_FILE: str(code_file)})
        codes = reported_codes(code_file)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if exits.PERMANENT in codes:
        log.error(
            "a training process failed permanently (exit %d; accelerate exited %d): exiting %d, a restart "
            "cannot fix this",
            exits.PERMANENT,
            status,
            exits.PERMANENT,
        )
        return exits.PERMANENT
    if codes and all(code == exits.STOPPED for code in codes):
        # SIGTERM, passed on by torchrun: the ranks saved a step checkpoint and exited 75 (torchrun: 1)
        log.info("the training processes stopped after a checkpoint (exit %d; accelerate exited %d): "
                 "exiting %d", exits.STOPPED, status, exits.STOPPED)
        return exits.STOPPED
    if status != 0:
        log.error("accelerate launch exited %d", status)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        format="%(asctime)s %(levelname)s [launch] %(message)s", datefmt="%H:%M:%S", level=logging.INFO
    )
    # The launcher is the container's PID 1, which the kernel spares from signals it has no handler
    # for: without this, a pod deleted before the child starts (or a one-process run) would ignore SIGTERM
    # and only stop at the grace period's SIGKILL. launch_accelerate replaces it with forwarding.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    args = trainer_args(sys.argv[1:] if argv is None else argv)
    try:
        plan = plan_from_env(os.environ, args)
    except LaunchError as err:
        log.error("%s", err)
        return exits.LAUNCH
    # as `accelerate launch` does
    os.environ[ACCELERATE_MIXED_PRECISION] = accelerate_precision(plan.mixed_precision)
    if plan.total_processes == 1:
        log.info("one process in total: training in this process")
        from .cli import main as train_main

        return train_main(with_precision_flag(args, plan.mixed_precision), pod=plan)

    from .resources import cpu_limit, plan_cpu

    threads = plan_cpu(cpu_limit(plan.cpu_limit).cpus, plan.procs_per_machine).threads
    command = accelerate_command(plan, args, threads)
    log.info(
        "machine %d of %d: %s (once %s resolves)",
        plan.machine_rank,
        plan.num_machines,
        " ".join(command),
        plan.main_addr,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    return launch_accelerate(child_command(plan, command), os.environ)


def entrypoint() -> NoReturn:
    """``pets-launch``: :func:`main`, then out without the interpreter's teardown (leave.py)."""
    mark_process_start(os.environ, time.time())
    from .leave import leave

    leave(main())


if __name__ == "__main__":
    entrypoint()
