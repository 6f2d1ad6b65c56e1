"""leave.py: an entry point's exit skips the interpreter's teardown but keeps its code and its output."""

from __future__ import annotations

import subprocess

import pytest

from .helpers import PYTHON

pytestmark = pytest.mark.unit

LEAVING = """
import atexit, logging, sys
from pets_training.leave import leave
logging.basicConfig(format="%(message)s", stream=sys.stderr)
atexit.register(lambda: print("atexit ran"))
print("on stdout", end="")
logging.getLogger("t").warning("on the log")
sys.stderr.write("on stderr")
leave(3)
"""


def test_leave_keeps_the_exit_code_and_flushes_what_was_written_to_a_pipe() -> None:
    proc = subprocess.run([str(PYTHON), "-c", LEAVING], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert proc.stdout == "on stdout"  # block-buffered on a pipe: lost without the flush
    assert proc.stderr == "on the log\non stderr"
    assert "atexit ran" not in proc.stdout  # the teardown it saves: atexit handlers and module cleanup

