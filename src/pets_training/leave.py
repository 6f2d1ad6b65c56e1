"""Leaving a finished process without the interpreter's own teardown.

With torch, torchvision, timm and accelerate imported, Python's exit (module teardown, freeing every
object) costs 0.5-1 s of CPU. A pod's trainer, its accelerate launcher and its forkserver each paid it
after the work was done, about 3 s at the end of every training on a 1-CPU pod. The entry points leave
with ``os._exit`` instead, once the logs and the standard streams are flushed. Every file the run writes
is closed by then, the trackers are ended and the process group is left (``finish.end_run``), so the
atexit handlers skipped have nothing left to do.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn


def leave(code: int) -> NoReturn:
    """Flush the logs and the standard streams, then exit with ``code`` at once."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or gone: nothing left to lose
            stream.flush()
    os._exit(code)
