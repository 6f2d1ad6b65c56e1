"""``pets-train``: train (flags = settings, see ``pets-train --help``), or ``pets-train make-synthetic``.

Exit codes (docs/contract.md): 0 done (or stopped as asked); 75 (``exits.STOPPED``, EX_TEMPFAIL)
stopped by SIGTERM after a step checkpoint (every rank finishes its step, they agree, save once; ``--resume``
continues at that step); 78 (``exits.PERMANENT``, EX_CONFIG) a
failure no restart can fix (:class:`~.contract.PermanentError`: a bad flag or config value, model, weights,
a hub that cannot be reached for pretrained weights, data, or pod environment); 1 anything else. On
failure the summary ``{"status": "failed", "error": ..., "global_step": ..., "time_seconds": ...}`` (the
step and the time split only once the training loop began) goes where the success summary would, and a
failing process appends its code to ``$PETS_EXIT_CODE_FILE`` when set (``pets-launch`` sets it:
torchrun's own exit code does not say why a worker failed). A trainer superseded by a newer attempt
(:class:`~.checkpoint.SupersededError`, also 78) writes its failure summary only to ``--summary-path``:
the output directory belongs to the newer attempt.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pets_contract import exits
from pets_contract import summary as summary_keys
from pets_contract.env import EXIT_CODE_FILE

from .contract import ContractError, PermanentError, PodContract, ProcessContext

if TYPE_CHECKING:
    from .stepsave import StopRequest

log = logging.getLogger("pets_training")


def make_synthetic(argv: Sequence[str]) -> int:
    from .synthetic import write_synthetic

    parser = argparse.ArgumentParser(
        prog="pets-train make-synthetic",
        description="Write the deterministic synthetic pets set as <label>_<n>.jpg files.",
    )
    parser.add_argument("out", type=Path, help="directory to write (created if missing)")
    parser.add_argument("--classes", type=int, default=37, help="number of classes (default: 37)")
    parser.add_argument("--per-class", type=int, default=20, help="images per class (default: 20)")
    parser.add_argument("--size", type=int, default=256, help="image side in pixels (default: 256)")
    parser.add_argument("--seed", type=int, default=42, help="seed (default: 42)")
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality (default: 90)")
    args = parser.parse_args(list(argv))
    for name in ("classes", "per_class", "size"):
        if getattr(args, name) < (2 if name == "classes" else 1):
            parser.error(f"--{name.replace('_', '-')} is too small: {getattr(args, name)}")
    count = write_synthetic(args.out, args.classes, args.per_class, args.size, args.seed, args.quality)
    print(f"wrote {count} images to {args.out}")
    return 0


def _failure_paths(
    argv: Sequence[str], default_output: str | None, superseded: bool = False
) -> list[Path | str | None]:
    """Where the failure summary goes, read leniently from the flags (the config may be what failed).
    ``superseded``: only ``--summary-path`` (the pod's own), not the output directory a newer attempt owns."""
    from .config import TrainConfig

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--summary-path")
    parser.add_argument("--output-dir")
    known, _ = parser.parse_known_args(list(argv))
    output = TrainConfig(output_dir=known.output_dir).resolved_output_dir(default_output)
    paths: list[Path | str | None] = [known.summary_path]
    if output.is_dir() and not superseded:
        paths.append(output / "summary.json")
    return paths


def stopped_summary(stop: StopRequest) -> dict[str, object]:
    """The termination message of a run stopped by SIGTERM (exit 75), for ``--summary-path`` only."""
    saved = f"saving {stop.checkpoint}" if stop.checkpoint else "without a checkpoint (--no-checkpoints)"
    why = stop.reason or "another rank was asked to stop"
    return {
        summary_keys.STATUS: summary_keys.STOPPED,
        "exit_code": exits.STOPPED,
        summary_keys.GLOBAL_STEP: stop.global_step,
        "checkpoint": stop.checkpoint or None,
        "error": f"stopped ({why}) at global step {stop.global_step} after {saved}; --resume continues "
        "from it",
        summary_keys.TIME_SECONDS: stop.time_seconds,  # this process's run, up to the stop
    }


def failed_summary(message: str, stop: StopRequest) -> dict[str, object]:
    """The summary of a run that failed: why, and the global step it reached and its time split when its
    training loop had begun (``stop``, set on the way out of ``training_function``)."""
    summary: dict[str, object] = {summary_keys.STATUS: summary_keys.FAILED, summary_keys.ERROR: message}
    if stop.global_step is not None:
        summary[summary_keys.GLOBAL_STEP] = stop.global_step
        summary[summary_keys.TIME_SECONDS] = stop.time_seconds  # the operator's split of the failed run
    return summary


def report_exit_code(code: int, env: Mapping[str, str] = os.environ) -> None:
    """Append ``code`` to ``$PETS_EXIT_CODE_FILE`` (one line per failing process), for ``pets-launch``."""
    path = env.get(EXIT_CODE_FILE)
    if not path:
        return
    try:
        with open(path, "a") as f:
            f.write(f"{code}\n")
    except OSError as err:
        log.warning("could not write the exit code to %s (%s): %s", path, EXIT_CODE_FILE, err)


def main(argv: Sequence[str] | None = None, pod: PodContract | None = None) -> int:
    """``pod``: the pod contract when the caller (the launcher) has read it already."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "make-synthetic":
        return make_synthetic(argv[1:])

    from .hubcache import set_hub_timeout_defaults

    set_hub_timeout_defaults(os.environ)  # before huggingface_hub reads them at import (via timm)
    from .checkpoint import SupersededError
    from .config import resolve
    from .progress import write_summary
    from .train import setup_logging, training_function

    process = ProcessContext.from_env(os.environ)
    setup_logging(process.rank)
    superseded = False
    # SIGTERM (a preemption, a pod deletion; torchrun passes it to every rank): finish the step, save a
    # step checkpoint, exit 75. The default would die at once, losing everything since the last save.
    from .stepsave import StopRequest

    stop = StopRequest()
    previous = signal.signal(signal.SIGTERM, stop.on_signal)
    try:
        pod = PodContract.from_env(os.environ) if pod is None else pod
        cfg = resolve(argv)
        training_function(cfg, pod=pod, process=process, stop=stop)
        if stop.stopped:
            log.info("stopped (%s): exit %d; --resume continues from the checkpoint just saved",
                     stop.reason or "another rank was asked to stop", exits.STOPPED)
            if process.local_rank == 0:  # the termination message; <output>/summary.json stays the finish's
                write_summary(stopped_summary(stop), [cfg.summary_path])
            report_exit_code(exits.STOPPED)
            return exits.STOPPED
        return 0
    except (PermanentError, ContractError) as err:
        superseded = isinstance(err, SupersededError)
        log.error("%s (permanent: exit %d, a restart cannot fix this)", err, exits.PERMANENT)
        code, message = exits.PERMANENT, " ".join(str(err).split())  # one line
    except Exception as err:
        log.exception("training failed")
        code, message = exits.FAILURE, f"{type(err).__name__}: {err}"
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if process.local_rank == 0:
        paths = _failure_paths(argv, pod.output_dir if pod else None, superseded)
        write_summary(failed_summary(message, stop), paths)
    report_exit_code(code)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
