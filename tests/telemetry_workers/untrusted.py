"""A worker that abuses the statistics channel (tests/test_telemetry_channel.py), no torch.

Every rank steps ``--steps`` times (``telemetry.step()``, 20 ms each). Rank ``--rank`` also, at
step ``--at``:

- ``pids``: sends datagrams naming ``--victim`` (an unrelated process), a negative pid and -1 as its
  pid, and SIGKILL as its dump signal, then hangs in a pure-Python loop.
- ``garbage``: sends NaN, Infinity, 1e999, deep nesting, wrong types, bad phase names, a huge
  datagram and another rank's number to its own address, and a valid batch to rank 0's; steps on.
- ``fork``: forks a child that steps with the telemetry API and exits normally (its ``final`` at
  exit), and one that sends a raw ``final`` batch for the rank; then hangs.
- ``freeze``: right after its first step, freezes in a C call that holds the GIL (``--at`` unused).
- ``flood``: floods its own address with valid progress datagrams for ``--flood-s`` seconds.
- ``clean``: removes everything under ``$TMPDIR`` (the launcher's run directory with it); steps on.

Prints ``ABUSED <mode>`` once the abuse is done.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import sys
import time

from openclaw_launch import telemetry
from openclaw_launch.telemetry import wire


def _send(rank: int, payload: bytes | dict[str, object]) -> None:
    """As the rank's own process: with the run's token, which every datagram starts with."""
    data = os.environ[wire.TOKEN_ENV].encode() + (
        payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            s.sendto(data, wire.rank_address(os.environ[wire.SOCKET_ENV], rank))
        except OSError as exc:
            print(f"send failed: {exc}", file=sys.stderr)


def _progress(rank: int, **extra: object) -> dict[str, object]:
    return {"v": 1, "kind": "progress", "rank": rank, "steps": 1, "step_age_s": 0.0, "phase_age_s": 0.0, **extra}


def _hang() -> None:
    while True:
        time.sleep(0.05)


def _abuse(mode: str, rank: int, victim: int) -> None:
    if mode == "pids":
        for pid in (victim, -victim, -1, 1):
            _send(rank, _progress(rank, pid=pid, dump_signal=wire.dump_signal()))
            _send(rank, _progress(rank, dump_signal=int(signal.SIGKILL)))
    elif mode == "garbage":
        batch = {"v": 1, "rank": rank, "steps": [[0.02, {"compute": 0.01}]], "final": False}
        for raw in (
            b'{"v":1,"rank":%d,"steps":[[NaN,{}]]}' % rank,
            b'{"v":1,"rank":%d,"steps":[[Infinity,{}]]}' % rank,
            b'{"v":1,"rank":%d,"steps":[[1e999,{}]]}' % rank,
            b'{"v":1,"kind":"progress","rank":%d,"steps":1,"step_age_s":-Infinity}' % rank,
            b"[" * 50_000,
            b"\xff\xfe",
            b"x" * 65_000,
        ):
            _send(rank, raw)
        _send(rank, {**batch, "steps": "many"})
        _send(rank, {**batch, "rank": True})
        _send(rank, {**batch, "final": "yes"})
        _send(rank, {**batch, "steps": [[0.02, {"bad\nname": 0.01}]]})
        _send(rank, {**batch, "steps": [[0.02, {"x" * 500: 0.01}]]})
        _send(rank, {**batch, "steps": [[0.02, {"compute": -1}]]})
        _send(rank, {**batch, "rank": rank + 1})  # another rank's number on its own socket
        _send(0, {**batch, "rank": 0})  # a valid batch on another rank's socket
    elif mode == "fork":
        if os.fork() == 0:  # the telemetry API in a child: its steps and its exit are not the rank's
            for _ in range(5):
                telemetry.step()
            sys.exit(0)
        if os.fork() == 0:  # a raw final batch for the rank from a child
            _send(rank, {"v": 1, "rank": rank, "steps": [[0.02, {}]], "final": True})
            os._exit(0)
        os.wait()
        os.wait()
    elif mode == "flood":
        small = os.environ[wire.TOKEN_ENV].encode() + json.dumps(_progress(rank)).encode()  # small and valid
        end = time.monotonic() + FLOOD_S
        address = wire.rank_address(os.environ[wire.SOCKET_ENV], rank)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.setblocking(False)
            while time.monotonic() < end:
                with contextlib.suppress(BlockingIOError):
                    s.sendto(small, address)
    elif mode == "clean":
        tmp = os.environ["TMPDIR"]
        for name in os.listdir(tmp):
            shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
    print(f"ABUSED {mode}", flush=True)
    if mode in ("pids", "fork"):
        _hang()


FLOOD_S = 2.0


def main() -> None:
    global FLOOD_S
    p = argparse.ArgumentParser()
    p.add_argument("--mode", required=True)
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--at", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--victim", type=int, default=0)
    p.add_argument("--flood-s", type=float, default=2.0)
    p.add_argument("--marker", default="")
    args = p.parse_args()
    FLOOD_S = args.flood_s
    rank = int(os.environ["RANK"])
    mine = rank == args.rank
    for step in range(args.steps):
        if mine and step == args.at and args.mode != "freeze":
            _abuse(args.mode, rank, args.victim)
        with telemetry.section("compute"):
            time.sleep(0.02)
        telemetry.step()
        if mine and args.mode == "freeze":
            print("ABUSED freeze", flush=True)
            while True:  # the stack-dump signal ends one sleep: freeze again
                ctypes.PyDLL(None).sleep(3600)  # holds the GIL: no progress thread runs after this
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
