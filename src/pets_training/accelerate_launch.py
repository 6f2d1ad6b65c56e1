"""``python -m pets_training.accelerate_launch HOST SECONDS <accelerate launch args>``: the child that
``pets-launch`` starts on a machine of several.

It imports ``accelerate launch`` (and with it torch: about 2 s of a pod's CPU) *first*, then waits
(bounded, :func:`.launch.wait_for_address`) for the main address ``HOST`` to resolve, then runs
``accelerate launch`` in this process, exactly as ``python -m accelerate.commands.launch`` would.

The order is the point (docs/trainer.md, "Start-up: where the time goes"): a name looked up before the
headless Service publishes pod 0 gets NXDOMAIN, and CoreDNS caches that answer for the zone's TTL (5 s on
our cluster, 30 s with kubeadm's default Corefile), so a machine that starts at the same moment as pod 0
and asks at once waits out the cache. Importing first overlaps that start-up with pod 0's publication,
which usually makes the first lookup the successful one.

Exit codes: 2 (``exits.LAUNCH``) when ``HOST`` did not resolve within ``SECONDS``, else accelerate
launch's.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence

from pets_contract import exits

from .contract import ContractError

log = logging.getLogger("pets_training.launch")

LOG_FORMAT = "%(asctime)s %(levelname)s [launch] %(message)s"


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(format=LOG_FORMAT, datefmt="%H:%M:%S", level=logging.INFO)
    argv = list(sys.argv[1:] if argv is None else argv)
    host, timeout, accelerate_args = argv[0], float(argv[1]), argv[2:]
    started = time.monotonic()
    from accelerate.commands.launch import launch_command, launch_command_parser

    from .launch import wait_for_address

    log.info("accelerate launch imported in %.1f s; resolving %s", time.monotonic() - started, host)
    try:
        wait_for_address(host, timeout)
    except ContractError as err:
        log.error("%s", err)
        return exits.LAUNCH
    launch_command(launch_command_parser().parse_args(accelerate_args))
    return 0


if __name__ == "__main__":
    from .leave import leave

    leave(main())
