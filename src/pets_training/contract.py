"""The pod contract (docs/contract.md), read from the environment in this one place; the names are
``pets_contract.env``'s, imported from there by every module that needs one, as the exit codes are from
``pets_contract.exits``.

Two readers, each pure (``from_env`` takes the mapping), each naming the variable and its value in its
errors:

- :class:`PodContract`: what the pod's environment says (set by the operator, the workload's controller,
  or the image), read by the launcher and by the trainer.
- :class:`ProcessContext`: what the launcher of each training process (torchrun under ``accelerate
  launch``, ``notebook_launcher``) says, for the moments where no ``Accelerator`` exists yet or where
  accelerate does not expose it. Once an ``Accelerator`` exists, prefer its ``process_index`` and
  ``local_process_index``.

Everything else about a run travels as trainer flags (mixed precision, output directory, ...).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass

from pets_contract.env import (
    ACCELERATE_MIXED_PRECISION,
    ATTEMPT,
    CPU_LIMIT,
    DEFAULT_MAIN_PORT,
    GPUS,
    JOB_COMPLETION_INDEX,
    LOCAL_RANK,
    LOCAL_WORLD_SIZE,
    MAIN_ADDR,
    MAIN_PORT,
    MASTER_ADDR,
    MASTER_PORT,
    NUM_MACHINES,
    OUTPUT_DIR,
    PROCESS_STARTED,
    PROCS_PER_MACHINE,
    RANK,
    RESOLVE_TIMEOUT,
    WORLD_SIZE,
)


class PermanentError(ValueError):
    """A failure no restart can fix (a bad flag or config value, model, weights, data); the message is one
    line naming the flag or field and its value. The trainer exits ``exits.PERMANENT`` (78) for it."""


class ContractError(ValueError):
    """A bad environment; the message names the variable and its value."""


def _int(env: Mapping[str, str], names: Sequence[str], default: int, minimum: int) -> int:
    """The first of ``names`` that is set, as an integer of at least ``minimum``."""
    for name in names:
        raw = env.get(name, "").strip()
        if raw:
            try:
                value = int(raw)
            except ValueError:
                raise ContractError(f"{name} must be an integer, got {raw!r}") from None
            if value < minimum:
                raise ContractError(f"{name} must be at least {minimum}, got {value}")
            return value
    return default


def attempt_number(env: Mapping[str, str]) -> int | None:
    """``$PETS_ATTEMPT`` (the checkpoint fence's token) as an integer of at least 0; None when unset."""
    return _int(env, [ATTEMPT], 0, 0) if env.get(ATTEMPT, "").strip() else None


def _str(env: Mapping[str, str], names: Sequence[str], default: str | None) -> str | None:
    """The first of ``names`` that is set (not blank), stripped."""
    return next((raw for name in names if (raw := env.get(name, "").strip())), default)


def _port(env: Mapping[str, str]) -> int:
    port = _int(env, [MAIN_PORT, MASTER_PORT], DEFAULT_MAIN_PORT, 1)
    if port > 65535:
        raise ContractError(f"{MAIN_PORT} must be a TCP port (1-65535), got {port}")
    return port


def _timeout(env: Mapping[str, str]) -> float:
    raw = _str(env, [RESOLVE_TIMEOUT], "300") or "300"
    try:
        timeout = float(raw)
    except ValueError:
        raise ContractError(f"{RESOLVE_TIMEOUT} must be a number of seconds, got {raw!r}") from None
    if timeout < 0:
        raise ContractError(f"{RESOLVE_TIMEOUT} must be 0 or more, got {raw!r}")
    return timeout


def _cpus(env: Mapping[str, str]) -> int | None:
    """The downward API's ``limits.cpu`` in whole cores, rounded up."""
    raw = _str(env, [CPU_LIMIT], None)
    if raw is None:
        return None
    try:
        value = math.ceil(float(raw))
    except (ValueError, OverflowError):
        raise ContractError(f"{CPU_LIMIT} must be a number of CPUs, got {raw!r}") from None
    if value < 1:
        raise ContractError(f"{CPU_LIMIT} must be at least 1, got {raw!r}")
    return value


def mark_process_start(env: MutableMapping[str, str], now: float) -> None:
    """An entry point's first act: the training processes it starts count their start-up from ``now`` (Unix
    time). An entry point started by another keeps the first one's time."""
    env.setdefault(PROCESS_STARTED, f"{now:.3f}")


def take_process_start(env: MutableMapping[str, str], now: float) -> float | None:
    """How long ago (seconds) the entry point that started this process started; None where none said so,
    or said no time before ``now``. Taken once: a second run in the same process counts from its own
    start."""
    raw = env.pop(PROCESS_STARTED, None)
    if raw is None:
        return None
    try:
        ago = now - float(raw)
    except ValueError:
        return None
    return ago if 0.0 <= ago < math.inf else None


@dataclass(frozen=True)
class PodContract:
    """The pod's environment; the defaults are those of one machine training alone.

    ``machine_rank`` is JOB_COMPLETION_INDEX, else RANK as a PyTorchJob sets it on the pod. Inside a
    training process torchrun has replaced RANK with the process's rank, so only the launcher, which
    runs before torchrun, uses the gang's fields (and checks the rank against ``num_machines``).
    """

    machine_rank: int = 0
    num_machines: int = 1
    procs_per_machine: int = 1
    main_addr: str = "127.0.0.1"
    main_port: int = DEFAULT_MAIN_PORT
    resolve_timeout: float = 300.0
    cpu_limit: int | None = None  # None: unknown here (the cgroup or the host then say)
    output_dir: str | None = None  # the default of --output-dir
    gpus: int = 0  # GPUs the pod was given (0: none said; the trainer then takes CUDA where it works)

    @property
    def total_processes(self) -> int:
        return self.num_machines * self.procs_per_machine

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PodContract:
        return cls(
            machine_rank=_int(env, [JOB_COMPLETION_INDEX, RANK], 0, 0),
            num_machines=_int(env, [NUM_MACHINES, WORLD_SIZE], 1, 1),
            procs_per_machine=_int(env, [PROCS_PER_MACHINE], 1, 1),
            main_addr=_str(env, [MAIN_ADDR, MASTER_ADDR], None) or cls.main_addr,
            main_port=_port(env),
            resolve_timeout=_timeout(env),
            cpu_limit=_cpus(env),
            output_dir=_str(env, [OUTPUT_DIR], None),
            gpus=_int(env, [GPUS], 0, 0),
        )


@dataclass(frozen=True)
class ProcessContext:
    """What the process launcher says about this training process (all defaults: a lone process)."""

    rank: int = 0
    local_rank: int = 0
    local_world_size: int = 1  # training processes on this machine; accelerate does not expose it
    mixed_precision: str | None = None  # `accelerate launch --mixed_precision`, the default of the flag

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ProcessContext:
        return cls(
            rank=_int(env, [RANK], 0, 0),
            local_rank=_int(env, [LOCAL_RANK], 0, 0),
            local_world_size=_int(env, [LOCAL_WORLD_SIZE], 1, 1),
            mixed_precision=_str(env, [ACCELERATE_MIXED_PRECISION], None),
        )
