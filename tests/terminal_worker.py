"""A worker for tests/test_terminal.py: what it sees of its terminal, a redrawn bar, a resize, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def probe(out: Path) -> None:
    """Write whether stdout/stderr are terminals and the window size each reports."""
    seen = {
        "stdout_isatty": sys.stdout.isatty(),
        "stderr_isatty": sys.stderr.isatty(),
        "stdout_size": list(os.get_terminal_size(1)) if sys.stdout.isatty() else None,
        "stderr_size": list(os.get_terminal_size(2)) if sys.stderr.isatty() else None,
    }
    (out / f"rank-{os.environ.get('RANK', '0')}.json").write_text(json.dumps(seen))


def bar(steps: int) -> None:
    """A progress bar as tqdm(disable=None) draws one: only on a terminal, redrawn with \\r."""
    if not sys.stderr.isatty():
        print("no terminal: no bar", file=sys.stderr)
        return
    for i in range(steps + 1):
        sys.stderr.write(f"\rstep {i}/{steps} \x1b[32m{'#' * i}\x1b[0m")
        sys.stderr.flush()
        time.sleep(0.02)
    sys.stderr.write("\n")


def real_tqdm(steps: int) -> None:
    """tqdm as scripts use it: ``disable=None`` draws only on a terminal."""
    from tqdm import tqdm

    for _ in tqdm(range(steps), disable=None, mininterval=0, ascii=True):
        time.sleep(0.01)


def mixed(steps: int) -> None:
    """A bar on stderr with a line printed on stdout while it is drawn (a log line during tqdm)."""
    for i in range(steps + 1):
        sys.stderr.write(f"\rstep {i}/{steps}")
        sys.stderr.flush()
        time.sleep(0.05)  # the bar is on the console before the line comes (any order passes the test)
        print(f"loss {i}", flush=True)
        time.sleep(0.05)
    sys.stderr.write("\n")


def resize(out: Path) -> None:
    """Say the window size whenever it changes (polled, as tqdm and rich read it), until told to stop."""
    last = None
    while not (out / "stop").exists():
        size = tuple(os.get_terminal_size(1))
        if size != last:
            print(f"size {size[0]}x{size[1]}", flush=True)
            last = size
        time.sleep(0.01)


def interrupted(out: Path) -> None:
    """Wait for SIGINT or SIGTERM and record who sent it (0: the kernel, i.e. a terminal's Ctrl-C)."""
    wanted = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
    print("ready for ctrl-c", flush=True)
    info = signal.sigwaitinfo(wanted)
    rank = os.environ.get("RANK", "0")
    (out / f"signal-{rank}.json").write_text(json.dumps({"signo": info.si_signo, "pid": info.si_pid}))
    sys.exit(128 + info.si_signo)


if __name__ == "__main__":
    mode, arg = sys.argv[1], sys.argv[2]
    modes = {"probe": probe, "bar": bar, "tqdm": real_tqdm, "mixed": mixed, "resize": resize, "interrupt": interrupted}
    modes[mode](int(arg) if mode in ("bar", "tqdm", "mixed") else Path(arg))  # type: ignore[operator]
