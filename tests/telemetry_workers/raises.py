"""Errors raised inside hooked torch calls, with no openclaw code: ``--mode backward`` calls
``backward()`` on a tensor that needs no gradient (an everyday mistake); ``--mode all_reduce`` passes
``dist.all_reduce`` something that is not a tensor; ``--mode interrupt`` is a Ctrl-C (SIGINT) that
arrives while rank 0 waits in ``dist.all_reduce`` for rank 1."""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("backward", "all_reduce", "interrupt"), required=True)
    args = p.parse_args()

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.mode == "backward":
        torch.ones(2).sum().backward()
    elif args.mode == "all_reduce":
        dist.all_reduce("not a tensor")  # type: ignore[arg-type]
    else:
        if rank == 0:
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        else:
            time.sleep(2.0)
        dist.all_reduce(torch.ones(1))
        if rank == 0:
            time.sleep(5.0)  # the interrupt arrives here if it missed the collective


if __name__ == "__main__":
    main()
