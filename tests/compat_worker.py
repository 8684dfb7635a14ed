"""A worker as torchrun users write them, for the torchrun compatibility tests.

``--dump DIR``: write the rank variables, the arguments argparse left (``argv``) and the raw
``sys.argv[1:]`` (``sys_argv``, DIR as ``{dump}``) to DIR/rank-<RANK>.json (and exit ``--exit``).
``--checkpoint-on-sigterm S FILE``: on SIGTERM, "checkpoint" for S seconds, write FILE, exit 0.
``--partial-then-sigkill TEXT``: print TEXT without newline or flush, then SIGKILL itself.
``--redraw-until FILE``: draw ``\\rstep N`` (no newline) until FILE exists, then end the line.
``--say``: print ``say-<LOCAL_RANK>-stdout`` on stdout and ``say-<LOCAL_RANK>-stderr`` on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from guards import wait_for

DUMPED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES")
DUMPED_PREFIXES = ("GROUP_", "ROLE_", "TORCHELASTIC_")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dump")
    p.add_argument("--exit", type=int, default=0)
    p.add_argument("--checkpoint-on-sigterm", nargs=2)
    p.add_argument("--ready-file")
    p.add_argument("--partial-then-sigkill")
    p.add_argument("--redraw-until")
    p.add_argument("--say", action="store_true")
    a, rest = p.parse_known_args()
    if a.dump:
        env = {k: v for k, v in os.environ.items() if k in DUMPED or k.startswith(DUMPED_PREFIXES)}
        env["argv"] = json.dumps(rest)
        env["sys_argv"] = json.dumps(["{dump}" if arg == a.dump else arg for arg in sys.argv[1:]])
        with open(os.path.join(a.dump, f"rank-{os.environ['RANK']}.json"), "w") as f:
            json.dump(env, f)
        if a.exit:  # fail only once every rank has dumped
            wait_for(lambda: len(os.listdir(a.dump)) >= int(os.environ["WORLD_SIZE"]), "not every rank dumped")
    if a.checkpoint_on_sigterm:
        seconds, done = a.checkpoint_on_sigterm

        def checkpoint(signum: int, frame: object) -> None:
            time.sleep(float(seconds))
            with open(done, "w") as f:
                f.write("saved")
            os._exit(0)

        signal.signal(signal.SIGTERM, checkpoint)
        open(a.ready_file, "w").close()
        while True:
            time.sleep(1)
    if a.say:
        for name, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)):
            print(f"say-{os.environ['LOCAL_RANK']}-{name}", file=stream)
    if a.partial_then_sigkill:
        print(a.partial_then_sigkill, end="")  # python -u: written now, as under torchrun
        os.kill(os.getpid(), signal.SIGKILL)
    if a.redraw_until:
        step = 0
        while not os.path.exists(a.redraw_until):
            step += 1
            sys.stdout.write(f"\rstep {step}")
            time.sleep(0.05)
        sys.stdout.write("\n")
    return a.exit


if __name__ == "__main__":
    sys.exit(main())
