"""The launcher's side of the prewarm zygote (``--prewarm``, run/zygote.py): start it, ask it for
each worker, and fall back to the plain spawn, with one line, when it cannot serve.

The zygote is started once per run, before the guardian's first worker, as the plan's
``prewarm.argv`` in its own session, dying with the launcher (PR_SET_PDEATHSIG), with the
environment every rank shares (what its imports read then is what each rank's would read; what
differs between ranks is read after the fork: CUDA and the process group by the script, the
thread counts set by the worker, run/zygote.threads). A worker is asked for with the rank's argv
read as the plan wrote it: the numactl prefix (its flags become the worker's binding), the
``python -u`` the zygote is, and the rest, which the worker runs. The answer is its pid: a child of
this launcher (the subreaper) in its own session, as a spawned worker is.

The zygote answers within the time its imports take; the launcher waits for that the first time
(a signal meanwhile is handled once the spawn returns). Any problem (an import that failed, a
thread or a CUDA context in the zygote, a zygote gone) is said once and every later worker is
spawned as the plan's argv says, directly.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from openclaw_launch.plan.prewarm import ZYGOTE_LINK_ENV, NumactlFlags, read_numactl
from openclaw_launch.single_thread import assert_single_threaded
from openclaw_launch.topology.cpulist import parse_cpulist

if TYPE_CHECKING:
    from openclaw_launch.plan.prewarm import PrewarmPlan

Say = Callable[[str], None]
PR_SET_PDEATHSIG = 1
READY_TIMEOUT_S = 300.0  # the zygote's imports (torch: ~2-4 s on a loaded small box)
ANSWER_TIMEOUT_S = 30.0  # one worker's fork and set-up
CLOSE_TIMEOUT_S = 2.0


class ZygoteUnusable(Exception):
    """The zygote cannot make this worker (why is the message); the caller spawns it directly."""


class Zygote:
    """One run's zygote; ``spawn`` raises ``ZygoteUnusable`` once it cannot serve."""

    def __init__(self, prewarm: PrewarmPlan, proc: subprocess.Popen[bytes], link: socket.socket, say: Say) -> None:
        self.prewarm = prewarm
        self._say = say
        self.pid = proc.pid
        self._proc = proc
        self._link = link
        self._in = b""
        self._ready = False
        self.problem: str | None = None  # why it no longer serves, once it does not
        self._reaped = False

    @classmethod
    def start(cls, prewarm: PrewarmPlan, env: Mapping[str, str], say: Say) -> Zygote:
        """Start the zygote (``prewarm.argv``) with ``env`` whole; it imports while the launcher goes on.
        ``say``: where the one line goes when it cannot serve."""
        assert_single_threaded("spawn the prewarm zygote (with a preexec_fn)")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        launcher = os.getpid()

        def child_setup() -> None:  # before exec: die with the launcher, never born an orphan
            import ctypes

            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != launcher:
                os._exit(126)

        try:
            proc = subprocess.Popen(
                list(prewarm.argv),
                env={**env, ZYGOTE_LINK_ENV: str(theirs.fileno())},
                stdout=subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=(theirs.fileno(),),
                preexec_fn=child_setup,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return cls(prewarm, proc, ours, say)

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], out_fd: int, err_fd: int, cgroup_procs: str | None
    ) -> int:
        """The pid of the worker the zygote forked for the plan's ``argv`` with ``env`` whole;
        ``out_fd``/``err_fd``: its stdout and stderr ends (the caller closes its copies);
        ``cgroup_procs``: the job cgroup it joins, as a spawned worker does."""
        if self.problem is not None:
            raise ZygoteUnusable(self.problem)
        entry = tuple(self.prewarm.entry)
        prefix, rest = tuple(argv[: len(argv) - len(entry)]), tuple(argv[len(argv) - len(entry) :])
        flags = read_numactl(prefix) if prefix else NumactlFlags()
        if rest != entry or flags is None:
            raise self._unusable(f"the rank's argv is not the prewarmed entry ({' '.join(argv)})")
        if not self._ready:
            self._await_ready()
        request = {
            "argv": list(entry[2:]),
            "env": dict(env),
            "cwd": os.getcwd(),
            "launcher": os.getpid(),
            "cpus": sorted({*flags.cpus, *_node_cpus(flags.cpu_nodes)}),
            "mem_policy": flags.mem_policy,
            "mem_nodes": list(flags.mem_nodes),
            "cgroup_procs": cgroup_procs,
        }
        data = (json.dumps(request) + "\n").encode()
        try:
            sent = self._link.sendmsg(
                [data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [out_fd, err_fd]))]
            )
            self._link.sendall(data[sent:])  # a signal may cut a large request short
        except OSError as exc:
            raise self._unusable(f"the zygote is gone ({exc.strerror or exc})") from None
        try:
            answer = self._answer(ANSWER_TIMEOUT_S)
        except ZygoteUnusable:
            self._stop()
            raise
        if answer.get("pid") is None:
            raise self._unusable(str(answer.get("problem")))
        return int(answer["pid"])

    def died(self, status: int) -> None:
        """The supervisor reaped the zygote (it collects every child)."""
        self._reaped = True
        self._proc.returncode = os.waitstatus_to_exitcode(status)
        if self.problem is None:
            self._unusable(f"the zygote (pid {self.pid}) ended with {self._proc.returncode}")

    def close(self) -> None:
        """Close the link (a zygote that serves exits at EOF) and collect it; SIGKILL after a short
        wait, or at once while it still imports or its ready line was never read (it holds nothing;
        killed before the link closes: a link closed with that line unread resets its end)."""
        if self._reaped:
            self._link.close()
            return
        if self._ready:
            self._link.close()
            with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
                self._proc.wait(CLOSE_TIMEOUT_S)
                return
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            self._proc.kill()
            self._proc.wait()
        self._link.close()

    def _stop(self) -> None:
        """SIGKILL a zygote that did not answer a request in time: the caller spawns that worker
        directly, and a zygote that went on to serve the request late would fork a second one beside
        it. The supervisor collects it (``died``); its link closes in ``close``."""
        if not self._reaped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def _await_ready(self) -> None:
        answer = self._answer(READY_TIMEOUT_S)
        if not answer.get("ready"):
            raise self._unusable(str(answer.get("problem")))
        self._ready = True

    def _answer(self, timeout_s: float) -> dict[str, Any]:
        """The zygote's next line, waited for up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._in:
            left = deadline - time.monotonic()
            readable = select.select([self._link], [], [], max(left, 0.0))[0] if left > 0 else []
            if not readable:
                raise self._unusable(f"the zygote did not answer within {timeout_s:g} s")
            chunk = self._link.recv(65536)
            if not chunk:
                raise self._unusable("the zygote is gone (its link closed)")
            self._in += chunk
        line, _, self._in = self._in.partition(b"\n")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def _unusable(self, problem: str) -> ZygoteUnusable:
        if self.problem is None:
            self._say(f"openclaw-launch: warning: --prewarm off: {problem}; the workers start without the zygote")
        self.problem = problem
        return ZygoteUnusable(problem)


def _node_cpus(nodes: Sequence[int]) -> set[int]:
    """The CPUs of NUMA nodes (numactl --cpunodebind), as the kernel lists them."""
    cpus: set[int] = set()
    for node in nodes:
        with open(f"/sys/devices/system/node/node{node}/cpulist") as f:
            cpus.update(parse_cpulist(f.read()))
    return cpus


def zygote_env(base: Mapping[str, str], ranks_env: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """The zygote's environment: the launcher's, with every variable all ranks set alike."""
    shared = dict(ranks_env[0]) if ranks_env else {}
    for env in ranks_env[1:]:
        shared = {k: v for k, v in shared.items() if env.get(k) == v}
    return {**base, **shared}
