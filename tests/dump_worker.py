"""A worker that writes down what it was really started with, for tests/test_plan_is_run.py.

``$PLAN_IS_RUN_DIR/rank-$RANK-attempt-$TORCHELASTIC_RESTART_COUNT.json``: ``sys.argv``, the argv it
was exec'd with (``/proc/self/cmdline``), its whole environment, and which of the run's paths it was
given exist (the telemetry socket, bound by the launcher, its stack file, the MPS pipe directory, the
parallel groups file). ``$PLAN_IS_RUN_FIRST_ATTEMPT`` says what it does next in attempt 0: ``fail``
(exit 1 once every rank of the world wrote its file: a restart), ``wait`` (until it is stopped: a
world that re-forms); else, and in later attempts, it exits 0.
"""

from __future__ import annotations

import json
import os
import sys
import time

PATH_VARIABLES = (
    "OPENCLAW_TELEMETRY_SOCKET",
    "OPENCLAW_STACKS_FILE",
    "CUDA_MPS_PIPE_DIRECTORY",
    "OPENCLAW_PARALLEL_FILE",
)


def _exists(value: str) -> bool:
    """A path, or an abstract socket (``@name``: the rank's own address under it, by local rank, is bound)."""
    if not value.startswith("@"):
        return os.path.exists(value)
    with open("/proc/net/unix") as f:
        return any(line.split()[-1] == f"{value}.{os.environ['LOCAL_RANK']}" for line in f if len(line.split()) >= 8)


def main() -> None:
    with open("/proc/self/cmdline", "rb") as f:
        cmdline = [part.decode() for part in f.read().split(b"\0")[:-1]]
    record = {
        "sys_argv": sys.argv,
        "cmdline": cmdline,
        "environ": dict(os.environ),
        "exists": {name: _exists(os.environ[name]) for name in PATH_VARIABLES if name in os.environ},
    }
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    out = os.environ["PLAN_IS_RUN_DIR"]
    path = os.path.join(out, f"rank-{os.environ['RANK']}-attempt-{attempt}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)
    then = os.environ.get("PLAN_IS_RUN_FIRST_ATTEMPT") if attempt == "0" else None
    if then == "fail":  # once every rank wrote its file: the launcher stops the others at the first failure
        world = [os.path.join(out, f"rank-{rank}-attempt-0.json") for rank in range(int(os.environ["WORLD_SIZE"]))]
        while not all(os.path.exists(p) for p in world):
            time.sleep(0.02)
        sys.exit(1)
    if then == "wait":
        while True:
            time.sleep(1)


if __name__ == "__main__":
    main()
