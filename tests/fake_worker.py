"""A stand-in training worker driven by argv, for supervisor tests with real processes.

File arguments may contain ``{rank}`` and ``{attempt}`` (RANK, TORCHELASTIC_RESTART_COUNT).
Order: signal set-up, --write-env, --mps-probe, --stdout/--stderr, --flood-mb, grandchildren,
--orphan-child, --ready-file, --wait-for, then the failure or --sleep.
Failure options (--exit, --raise, --segfault, --error-file) apply to every rank, or only to
``--only-rank`` and only while the attempt is below ``--fail-below-attempt``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import signal
import sys
import time
import traceback

from guards import wait_for

LOGGED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _path(template: str) -> str:
    return template.format(rank=os.environ.get("RANK", "0"), attempt=_attempt())


def _attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _write(path: str, text: str) -> None:
    """Atomic, so a test polling for the file never reads half of it."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def _affinity() -> dict[str, str]:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return {k: fields[k].strip() for k in ("Cpus_allowed_list", "Mems_allowed_list")}


def _sleeper(setsid: bool) -> int:
    """Fork a sleeping grandchild; return only once it is in its own session when asked.

    Waiting on a pipe closes the race where the test reads the pid (and its
    session) before the child has run ``setsid``.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        if setsid:
            os.setsid()
        os.write(w, b"1")
        os.close(w)
        time.sleep(3600)
        os._exit(0)
    os.close(w)
    os.read(r, 1)
    os.close(r)
    return pid


def _orphan_child(report: str) -> None:
    """Double fork a short-lived grandchild; report whether its adopter reaps it or leaves <defunct>."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        grandchild = os.fork()
        if grandchild == 0:
            time.sleep(0.2)  # outlive our parent: we exit as an orphan
            os._exit(0)
        os.write(w, str(grandchild).encode())
        os._exit(0)
    os.close(w)
    grandchild = int(os.read(r, 64))
    os.close(r)
    os.waitpid(child, 0)
    try:  # a zombie keeps its /proc entry until it is reaped
        wait_for(lambda: not os.path.exists(f"/proc/{grandchild}"), "the orphan was never reaped")
        verdict = "reaped"
    except AssertionError:
        verdict = "zombie"
    _write(report, verdict)


def _flood(megabytes: float, rank: int) -> None:
    """Lines ``r<rank> xxx...`` as fast as the pipe takes them; big writes split lines anywhere."""
    line = f"r{rank} {'x' * 100}\n".encode()
    block = line * (1048576 // len(line))
    for _ in range(int(megabytes)):
        sys.stdout.buffer.write(block)
    sys.stdout.buffer.flush()


def _mps_probe(path: str) -> None:
    """The MPS control daemon this worker was handed (pid file in its pipe dir) and whether it runs."""
    pid_file = os.path.join(os.environ["CUDA_MPS_PIPE_DIRECTORY"], "nvidia-cuda-mps-control.pid")
    with open(pid_file) as f:
        pid = int(f.read())
    try:
        with open(f"/proc/{pid}/stat") as f:
            alive = f.read().rpartition(")")[2].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        alive = False
    _write(path, json.dumps({"pid": pid, "alive": alive}))


def _log_signals(path: str, ignore_sigterm: bool, survive_usr: bool = False) -> None:
    def handler(signum: int, frame: object) -> None:
        with open(path, "a") as f:
            f.write(signal.Signals(signum).name + "\n")
        if signum == signal.SIGTERM and ignore_sigterm:
            return
        if signum in (signal.SIGUSR1, signal.SIGUSR2) and survive_usr:  # "checkpoint now", and go on
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for sig in LOGGED_SIGNALS:
        signal.signal(sig, handler)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--exit", type=int, default=None)
    p.add_argument("--raise", dest="raise_", action="store_true")
    p.add_argument("--segfault", action="store_true")
    p.add_argument("--error-file", action="store_true")
    p.add_argument("--only-rank", type=int, default=None)
    p.add_argument("--fail-below-attempt", type=int, default=None)
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--log-signals", default=None)
    p.add_argument("--survive-usr", action="store_true", help="with --log-signals: SIGUSR1/2 do not end it")
    p.add_argument("--grandchildren", type=int, default=0)
    p.add_argument("--setsid-grandchildren", action="store_true")
    p.add_argument("--pids-file", default=None)
    p.add_argument("--orphan-child", default=None)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--write-env", default=None)
    p.add_argument("--stdout", default=None)
    p.add_argument("--stderr", default=None)
    p.add_argument("--no-newline", action="store_true")
    p.add_argument("--flood-mb", type=float, default=0, help="write this many MiB of lines to stdout")
    p.add_argument("--mps-probe", default=None, help="write the MPS daemon's pid and liveness here")
    p.add_argument("--ready-file", default=None)
    p.add_argument("--wait-for", action="append", default=[], help="before failing, wait until this file exists")
    a = p.parse_args(argv)

    rank = int(os.environ.get("RANK", "0"))
    fails = (a.only_rank is None or a.only_rank == rank) and (
        a.fail_below_attempt is None or _attempt() < a.fail_below_attempt
    )
    if a.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if a.log_signals:
        _log_signals(_path(a.log_signals), a.ignore_sigterm, a.survive_usr)
    if a.write_env:
        _write(_path(a.write_env), json.dumps({"environ": dict(os.environ), **_affinity()}))
    if a.mps_probe:
        _mps_probe(_path(a.mps_probe))
    end = "" if a.no_newline else "\n"
    if a.stdout is not None:
        sys.stdout.write(a.stdout + end)
        sys.stdout.flush()
    if a.stderr is not None:
        sys.stderr.write(a.stderr + end)
        sys.stderr.flush()
    if a.flood_mb:
        _flood(a.flood_mb, rank)
    pids = [_sleeper(a.setsid_grandchildren) for _ in range(a.grandchildren)]
    if a.pids_file:
        _write(_path(a.pids_file), json.dumps({"worker": os.getpid(), "grandchildren": pids}))
    if a.orphan_child:
        _orphan_child(_path(a.orphan_child))
    if a.ready_file:
        _write(_path(a.ready_file), str(os.getpid()))
    for path in map(_path, a.wait_for):
        wait_for(functools.partial(os.path.exists, path), f"{path} never appeared", poll_s=0.01)
    if fails:
        if a.error_file:
            _write_error_file()
            return 1
        if a.raise_:
            raise RuntimeError(f"fake failure on rank {rank}")
        if a.segfault:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.kill(os.getpid(), signal.SIGSEGV)
        if a.exit is not None:
            return a.exit
    deadline = time.monotonic() + a.sleep
    while (left := deadline - time.monotonic()) > 0:  # signals interrupt sleep; keep sleeping
        time.sleep(left)
    return 0


def _write_error_file() -> None:
    """What torch.distributed.elastic's @record writes."""
    try:
        raise ValueError("bad batch shape (fake)")
    except ValueError as exc:
        message = f"{type(exc).__name__}: {exc}"
        callstack = traceback.format_exc()
    data = {
        "message": {
            "message": message,
            "extraInfo": {"py_callstack": callstack, "timestamp": str(int(time.time()))},
        }
    }
    _write(os.environ["TORCHELASTIC_ERROR_FILE"], json.dumps(data))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
