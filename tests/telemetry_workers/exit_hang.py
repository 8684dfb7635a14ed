"""A worker that says it is done and then does not exit (tests/test_hang_exit.py,
benchmarks/hang_exit.py): ``--steps`` telemetry steps of ``--step-ms``, then rank ``--rank``:

- ``c-exit``: registers a C exit handler that never returns (libc's ``pause()`` through
  ``__cxa_atexit``, as a stuck NCCL or CUDA teardown does) and returns: Python's own exit sends the
  final batch, then the C handler blocks;
- ``final``: sends its final batch itself (the recorder's ``close()``) and sleeps forever in Python.

Prints ``DONE <time>`` when it has said it is done. No torch: the other ranks just exit.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import time

from openclaw_launch import telemetry
from openclaw_launch.telemetry import recorder

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=("c-exit", "final", "none"), default="none")
p.add_argument("--rank", type=int, default=1)
p.add_argument("--steps", type=int, default=5)
p.add_argument("--step-ms", type=float, default=20.0)
p.add_argument("--marker", default="")
args = p.parse_args()
telemetry.step()
for _ in range(args.steps):
    time.sleep(args.step_ms / 1000)
    telemetry.step()
if int(os.environ["RANK"]) == args.rank and args.mode == "c-exit":
    libc = ctypes.CDLL(None)
    libc.__cxa_atexit(ctypes.cast(libc.pause, ctypes.c_void_p), None, None)
    print(f"DONE {time.time():.3f}", flush=True)
elif int(os.environ["RANK"]) == args.rank and args.mode == "final":
    rec = recorder.get()
    assert rec is not None
    rec.close()
    print(f"DONE {time.time():.3f}", flush=True)
    while True:
        time.sleep(0.05)  # BLOCKS-HERE final
