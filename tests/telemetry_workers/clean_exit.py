"""Leave a finished gloo rank before torch's C++ teardown.

torch 2.13's gloo teardown at interpreter exit aborts a finished rank now and then ("terminate
called without an active exception", SIGABRT) when a peer has already gone: a launcher test would
fail for a reason that is not the launcher's. The exit handlers still run (the launcher's telemetry
flushes there); only the C++ static destructors are skipped.
"""

from __future__ import annotations

import atexit
import os
import sys


def leave(code: int = 0) -> None:
    """Run the exit handlers, flush, and end the process with ``code``."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
