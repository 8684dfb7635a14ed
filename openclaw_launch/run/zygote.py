"""The prewarm zygote (``--prewarm``): one interpreter that imported the named modules once, and
forks each worker from there, so a restart's workers skip ``import torch``.

The launcher starts ``python -u -m openclaw_launch.run.zygote MODULE...`` (the plan's
``prewarm.argv``, run/prewarm.py) with the link's socket inherited
(its fd in ``OPENCLAW_ZYGOTE_LINK_FD``). The zygote imports the modules,
forks once and reaps the child at once (OpenBLAS, which numpy loads with torch, starts its thread
pool at load and stops it in its fork handler), then must have one thread (/proc/self/task) and no
CUDA context, or it says why and the launcher starts its workers as without ``--prewarm``.

Each worker is asked for with one request (JSON, the worker's stdout and stderr ends beside it by
SCM_RIGHTS) and made by a double fork: the zygote forks an intermediate, which forks the worker and
exits at once; the worker, an orphan, goes to the launcher (a child subreaper), which owns it as it
owns a worker it spawned itself (its pid is its process group and session, its exit status, its
signals). The worker first does what ``Popen`` and ``numactl`` do before exec (its own session, the
job's cgroup, stdout/stderr, CPU affinity, memory policy, cwd), then writes its pid to the zygote,
which answers the launcher with it (the intermediate reaped: the worker is the launcher's child
then). Then the worker dies with the launcher (PR_SET_PDEATHSIG once the launcher is its parent),
takes the rank's environment whole (``putenv`` too) and the thread counts a fresh process of the
rank would have, and runs what ``python -u`` would run after the plan's ``-u`` (the telemetry
bootstrap, or the script through it without its hooks).

The standard library only (and the link's name from plan/prewarm.py): the workers' interpreter
holds nothing of the launcher's.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import json
import os
import platform
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from openclaw_launch.plan.prewarm import ZYGOTE_LINK_ENV

MAX_REQUEST_BYTES = 4 << 20  # a rank's environment, argv and binding
PR_SET_PDEATHSIG = 1
# set_mempolicy(2) by machine (numactl's memory flags); MPOL_* from <linux/mempolicy.h>
SET_MEMPOLICY_NR = {"x86_64": 238, "aarch64": 237}
MPOL = {"preferred": 1, "bind": 2, "local": 4}


class WorkerJob:
    """What a forked worker runs once it has left the zygote's loop."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self.argv, self.env = list(argv), dict(env)


def main(modules: Sequence[str]) -> int:
    link = socket.socket(fileno=int(os.environ.pop(ZYGOTE_LINK_ENV)))
    problem = _prewarm(modules)
    if not _send(link, {"ready": problem is None, "problem": problem}) or problem is not None:
        return 0
    job = _serve(link)
    if job is None:
        return 0
    _run_worker(job)
    return 0


def _prewarm(modules: Sequence[str]) -> str | None:
    """Import the modules; None when the zygote may fork, else why not."""
    import importlib
    import traceback

    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # the user's module: any failure is a reason, never our end
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            return f"import {name} failed in the zygote ({last})"
    pid = os.fork()  # OpenBLAS (numpy's, loaded with torch) stops its threads in its fork handler
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return unsafe_to_fork()


def unsafe_to_fork() -> str | None:
    """Why this process may not fork now: a second thread, or a CUDA context (its state does not
    survive a fork); None when it may."""
    tasks = os.listdir("/proc/self/task")
    if len(tasks) > 1:
        names = ", ".join(sorted(_task_name(t) for t in tasks))
        return f"the zygote has {len(tasks)} threads after its imports ({names}): a fork with threads is unsafe"
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        return "CUDA was initialised in the zygote (by an imported module): a fork cannot share it"
    return None


def _task_name(tid: str) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return tid


def _serve(link: socket.socket) -> WorkerJob | None:
    """Answer requests until the launcher closes the link (None); in a forked worker, its job."""
    while True:
        request, fds = _receive(link)
        if request is None:
            return None
        try:
            problem = unsafe_to_fork()
            if problem is not None:
                if not _send(link, {"pid": None, "problem": problem}):
                    return None
                continue
            pid_or_job = _fork_worker(link, request, fds)
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if isinstance(pid_or_job, WorkerJob):
            return pid_or_job
        answer = {"pid": None, "problem": pid_or_job} if isinstance(pid_or_job, str) else {"pid": pid_or_job}
        if not _send(link, answer):
            return None


def _fork_worker(link: socket.socket, request: dict[str, Any], fds: list[int]) -> int | str | WorkerJob:
    """The double fork. Here: the worker's pid once it is set up and the intermediate is reaped (the
    worker is the launcher's child then), or why there is none; in the worker: its job."""
    pid_r, pid_w = os.pipe()
    intermediate = os.fork()
    if intermediate == 0:
        me = os.getpid()
        if os.fork() == 0:
            os.close(pid_r)
            link.close()
            return _become_worker(request, fds, pid_w, me)
        os._exit(0)
    os.close(pid_w)
    os.waitpid(intermediate, 0)
    with os.fdopen(pid_r, "rb") as said:
        pid = said.read()  # the worker writes its pid once set up (or failed), then closes
    return int(pid) if pid.isdigit() else "the worker died while it was being set up"


def _become_worker(request: dict[str, Any], fds: list[int], pid_w: int, intermediate: int) -> WorkerJob:
    """In the worker: what numactl and the launcher's spawn do before exec, then its pid to the zygote
    (a failure: numactl's, exit 1 with the reason on its stderr)."""
    os.setsid()  # first: the launcher signals the worker's group as soon as it has the pid
    failed = None
    try:
        if request.get("cgroup_procs"):
            with open(request["cgroup_procs"], "w") as f:
                f.write("0")
    except OSError:
        pass  # as the spawn's join: the process groups, the subreaper and the guardian still hold it
    try:
        out_fd, err_fd = fds
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        bind(request)
        os.chdir(request["cwd"])
    except OSError as exc:
        failed = exc
    os.write(pid_w, str(os.getpid()).encode())
    os.close(pid_w)
    if failed is not None:
        os.write(2, f"openclaw-launch: the prewarmed worker could not be set up: {failed}\n".encode())
        os._exit(1)
    _die_with(int(request["launcher"]), intermediate)
    return WorkerJob(request["argv"], request["env"])


def bind(request: Mapping[str, Any]) -> None:
    """What the plan's numactl prefix does: the CPUs (a node's, read by the launcher), the memory policy."""
    if request.get("cpus"):
        os.sched_setaffinity(0, request["cpus"])
    policy = request.get("mem_policy") or "none"
    if policy != "none":
        set_mempolicy(policy, request.get("mem_nodes") or ())


def set_mempolicy(policy: str, nodes: Sequence[int]) -> None:
    """set_mempolicy(2) as numactl --membind/--preferred/--localalloc calls it."""
    number = SET_MEMPOLICY_NR.get(platform.machine())
    if number is None:
        raise OSError(f"no set_mempolicy for {platform.machine()}: memory policy {policy} cannot be applied")
    bits = 64
    words = max(nodes, default=0) // bits + 1
    mask = (ctypes.c_ulong * words)()
    for node in nodes:
        mask[node // bits] |= 1 << (node % bits)
    libc = ctypes.CDLL(None, use_errno=True)
    local = policy == "local"
    rc = libc.syscall(number, MPOL[policy], None if local else mask, 0 if local else words * bits + 1)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"set_mempolicy({policy}, {list(nodes)}): {os.strerror(err)}")


def _die_with(launcher: int, intermediate: int) -> None:
    """Wait until the intermediate (which exits right after its fork) is gone, then die with the
    launcher, now the parent; exit as a worker whose launcher died would when another one is."""
    while os.getppid() == intermediate:
        os.sched_yield()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    if os.getppid() != launcher:  # the launcher is gone (or never took us): as a spawned worker would
        os._exit(126)


def _run_worker(job: WorkerJob) -> None:
    """The rank's environment whole, torch's threads as a fresh process counts them, numpy's global
    generator reseeded (Python's ``random`` reseeds itself at a fork), then python."""
    os.environ.clear()
    os.environ.update(job.env)
    threads(job.env)
    numpy_random = sys.modules.get("numpy.random")  # seeded at its import, in the zygote: one seed per rank
    if numpy_random is not None:
        numpy_random.seed()
    from openclaw_launch.telemetry import bootstrap

    hooks = job.argv[:2] == ["-m", bootstrap.__name__]  # the plan's -m openclaw_launch.telemetry.bootstrap
    bootstrap.main(job.argv[2:] if hooks else job.argv, hooks=hooks)


def threads(env: Mapping[str, str]) -> None:
    """OpenMP and OpenBLAS read their thread counts when loaded (in the zygote): set them as a fresh
    process of this rank would have them (OMP_NUM_THREADS, else the CPUs it may run on)."""
    count = _first_int(env.get("OMP_NUM_THREADS")) or len(os.sched_getaffinity(0))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(count)
    blas = _first_int(env.get("OPENBLAS_NUM_THREADS") or env.get("GOTO_NUM_THREADS")) or count
    for lib in _loaded_openblas():
        for symbol in ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_"):
            setter = getattr(lib, symbol, None)
            if setter is not None:
                setter(blas)
                break


def _first_int(value: str | None) -> int | None:
    head = (value or "").split(",")[0].strip()
    return int(head) if head.isdigit() and int(head) > 0 else None


def _loaded_openblas() -> list[ctypes.CDLL]:
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "openblas" in line and line.rstrip().endswith(".so")}
    return [ctypes.CDLL(p) for p in sorted(paths)]


def _send(link: socket.socket, message: Mapping[str, Any]) -> bool:
    """False: the launcher is gone (the zygote then ends quietly)."""
    try:
        link.sendall((json.dumps(message) + "\n").encode())
    except OSError:
        return False
    return True


def _receive(link: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One request (a line) and the fds that came with it; None at EOF."""
    fds = array.array("i")
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk, ancdata, _, _ = link.recvmsg(MAX_REQUEST_BYTES, socket.CMSG_SPACE(2 * fds.itemsize))
        except ConnectionResetError:  # the launcher ended with our ready line unread: as at EOF
            return None, list(fds)
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        if not chunk:
            return None, list(fds)
        data += chunk
    return json.loads(data), list(fds)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
