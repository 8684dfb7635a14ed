"""torchft's replica groups run by one launcher (``--replica-groups K``): the lighthouse, then
one group launcher per replica group, each supervising its own world; the job ends when every group
has ended.

Why a launcher per group: a group is exactly a one-node job of its own (plan/replica_groups.py
makes its ``LaunchPlan``), so each is run by job/launch.py's ``launch`` unchanged: its own
supervisor state machine and participants, its workers' store at its MASTER_PORT, its statistics,
its attempts and ``--max-restarts`` (counted per group), its guardian. The attempt contract needs
nothing new: a group that fails restarts its own workers while the other groups' launchers never
hear of it, which is torchft's point (the other Managers leave it out of their next quorum and keep
stepping; the restarted one heals from them). This process owns only what the groups share: the
lighthouse, the signals, the end and the summary. It forks each group launcher while it has one
thread (before any console or helper thread exists; job/launch.py starts those in the group). A
group launcher lives in its own session (a Ctrl-C reaches this process, which forwards it once)
and dies with this process (PR_SET_PDEATHSIG SIGKILL; its guardian then ends its workers), as the
lighthouse does.

openclaw's lighthouse (run/lighthouse_server.py) is told when a group is gone, so that the other
groups' next quorum does not wait for the dead group's heartbeat to expire: this process makes a
FIFO and holds it open (read and write: a write never blocks on a reader, the lighthouse never sees
its end while this process lives); the lighthouse reads it, and each group launcher, which inherits
the open end, writes ``gone PORT`` (its MASTER_PORT) the moment its supervisor stops an attempt for
a failure (its SIGCHLD) and when an attempt ends (GroupProgress); this process writes it too when
a group launcher itself ends. Each write is one line, atomic, never blocking (a full FIFO drops it).

The exit code: 0 when every group ended with 0; after a stopping signal 128+N; otherwise the code
of the first group that ended with a failure (its restarts spent, or a failure a restart cannot
help): the other groups train on without it to their own end (torchft's quorum shrinks), and the
job still says that a group failed. The lighthouse ending while groups run stops them (no quorum
can form without it): exit 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from openclaw_launch.codec import ReportShapeError, from_json, to_json
from openclaw_launch.errors import OpenclawError
from openclaw_launch.files import write_atomic
from openclaw_launch.job.group_progress import GroupProgress
from openclaw_launch.job.launch import launch
from openclaw_launch.job.lighthouse import Lighthouse
from openclaw_launch.plan.model import LaunchPlan
from openclaw_launch.plan.replica_groups import LIGHTHOUSE_NOTICES_ENV, ReplicaGroupsPlan
from openclaw_launch.report.replica_groups import (
    SCHEMA,
    GroupEntry,
    ReplicaGroupsReport,
    group_report_path,
    summary_line,
)
from openclaw_launch.report.replica_groups import GroupProgress as Progress
from openclaw_launch.run.helper import PR_SET_PDEATHSIG
from openclaw_launch.run.osproc import RealOs
from openclaw_launch.run.results import signal_name
from openclaw_launch.run.setup import forwarded, say
from openclaw_launch.run.supervise import ESCALATING_SIGNALS, SuperviseOptions
from openclaw_launch.single_thread import assert_single_threaded
from openclaw_launch.stats.wiring import StatsOptions

_LATE_S = 10.0  # after a stop, beyond the groups' own grace and kill timeouts: SIGKILL their launchers


@dataclass
class _Group:
    index: int
    plan: LaunchPlan
    pid: int
    progress_path: Path
    report_path: str | None
    gone: Callable[[], None] | None  # tells openclaw's lighthouse that the group's replica is gone
    exit_code: int | None = None


def _with_this_package(pythonpath: str) -> str:
    """``PYTHONPATH`` with this launcher's own package first: openclaw's lighthouse (``python -m``) is
    the code of the launcher that tells it, wherever the launcher was started from."""
    package_root = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join(p for p in (package_root, pythonpath) if p)


def _notifier(notices: int | None, port: int | None) -> Callable[[], None] | None:
    """``gone PORT`` to openclaw's lighthouse (this module's docstring); None: torchft's lighthouse."""
    if notices is None or port is None:
        return None
    line = f"gone {port}\n".encode()

    def gone() -> None:
        with contextlib.suppress(OSError):  # full (BlockingIOError): dropped, the heartbeat timeout stands
            os.write(notices, line)

    return gone


def launch_replica_groups(
    groups: ReplicaGroupsPlan,
    options: SuperviseOptions,
    report_path: str | None = None,
    stats: StatsOptions | None = None,
    exit_code_classes: bool = False,
    info: bool = False,
) -> int:
    """Start the lighthouse and the K group launchers, forward signals, wait for every group; return
    the job's exit code (this module's docstring)."""
    os_layer = RealOs()
    os_layer.install_signals((*options.forwarded_signals, *options.pass_signals, signal.SIGCHLD))
    work = Path(tempfile.mkdtemp(prefix=f"openclaw-{groups.node_plan.run_id}-groups-"))
    lighthouse: Lighthouse | None = None
    running: dict[int, _Group] = {}
    notices: int | None = None
    try:
        env: dict[str, str] = {}
        if groups.lighthouse.kind == "openclaw":
            os.mkfifo(work / "notices")
            notices = os.open(work / "notices", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
            env[LIGHTHOUSE_NOTICES_ENV] = str(work / "notices")
            env["PYTHONPATH"] = _with_this_package(os.environ.get("PYTHONPATH", ""))
        lighthouse = Lighthouse(groups.lighthouse, os_layer, options.log_dir, groups.node_plan.run_id, env)
        ended: list[_Group] = []
        for index, plan in enumerate(groups.groups):
            gone = _notifier(notices, plan.master_port)
            group = _fork_group(index, plan, options, work, report_path, stats, exit_code_classes, info, gone)
            running[group.pid] = group
        run = _Run(os_layer, options, lighthouse, running, ended)
        run.wait()
        lighthouse.stop()
        run.late(forwarded(os_layer.drain_signals(), options))  # one during the lighthouse's stop counts
        entries = tuple(_entry(g) for g in sorted(ended, key=lambda g: g.index))
        for entry in entries:
            say(options, f"openclaw-launch: {summary_line(entry)}")
        code = run.exit_code()
        if report_path:
            _write_report(report_path, groups, entries, run, code, options)
        return code
    finally:
        for pid in running:  # an exception escaped: no group launcher outlives this one
            os_layer.kill(pid, signal.SIGKILL)
        if lighthouse is not None:
            lighthouse.stop()
        if notices is not None:
            os.close(notices)
        os_layer.restore_signals()
        shutil.rmtree(work, ignore_errors=True)


class _Run:
    """The wait for every group: signals forwarded, ended groups collected, the lighthouse watched."""

    def __init__(
        self,
        os_layer: RealOs,
        options: SuperviseOptions,
        lighthouse: Lighthouse,
        running: dict[int, _Group],
        ended: list[_Group],
    ) -> None:
        self.os, self.opt, self.lighthouse = os_layer, options, lighthouse
        self.running, self.ended = running, ended
        self.signal_received: int | None = None
        self.lighthouse_failed: str | None = None
        self.first_failure: int | None = None
        self._kill_at: float | None = None  # once stopping: when the group launchers are SIGKILLed

    def wait(self) -> None:
        while self.running:
            timeout = None if self._kill_at is None else max(0.0, self._kill_at - time.monotonic())
            for fd in self.os.wait_fds(timeout):
                if fd in self.lighthouse.fds:
                    self.lighthouse.read(fd)
            for sig in self.os.drain_signals():
                self._on_signal(sig)
            for reaped in self.os.reap():
                if reaped.pid == self.lighthouse.pid:
                    self._lighthouse_ended(reaped.status)
                elif reaped.pid in self.running:
                    self._group_ended(self.running.pop(reaped.pid), reaped.status)
            if self._kill_at is not None and time.monotonic() >= self._kill_at:
                for pid in self.running:
                    self.os.kill(pid, signal.SIGKILL)

    def late(self, stopping: list[int]) -> None:
        """A stopping signal after the last group ended: as one received while they ran (128+N)."""
        if stopping and self.signal_received is None:
            self.signal_received = stopping[0]
            say(self.opt, f"openclaw-launch: received {signal_name(stopping[0])} after the last replica group ended")

    def _on_signal(self, sig: int) -> None:
        if sig == signal.SIGCHLD:
            return
        stopping = sig in self.opt.forwarded_signals and sig not in self.opt.pass_signals
        if stopping and self.signal_received is None:
            self.signal_received = sig
            say(
                self.opt, f"openclaw-launch: received {signal_name(sig)}: stopping {len(self.running)} replica group(s)"
            )
            self._stop_deadline()
        elif stopping and sig not in ESCALATING_SIGNALS:
            return  # forwarded once; a second SIGINT/SIGTERM is the group launchers' "SIGKILL now"
        for pid in self.running:
            self.os.kill(pid, sig)

    def _group_ended(self, group: _Group, status: int) -> None:
        if group.gone is not None:
            group.gone()
        code = os.waitstatus_to_exitcode(status)
        group.exit_code = code if code >= 0 else 128 - code
        self.ended.append(group)
        if group.exit_code != 0 and self.first_failure is None:
            self.first_failure = group.exit_code
        if group.exit_code != 0 and self.signal_received is None and self.lighthouse_failed is None:
            others = ", ".join(str(g.index) for g in sorted(self.running.values(), key=lambda g: g.index))
            going = f"; group(s) {others} go on" if others else ""
            say(self.opt, f"openclaw-launch: replica group {group.index} ended with exit code {group.exit_code}{going}")

    def _lighthouse_ended(self, status: int) -> None:
        self.lighthouse.reaped(status)
        if not self.running or self.signal_received is not None:
            return
        self.lighthouse_failed = self.lighthouse.ended
        words = self.lighthouse.last_words()
        say(
            self.opt,
            f"openclaw-launch: the lighthouse {self.lighthouse.ended} while {len(self.running)} replica "
            f"group(s) ran{': ' + words if words else ''}; stopping them (no quorum can form without it)",
        )
        for pid in self.running:
            self.os.kill(pid, signal.SIGTERM)
        self._stop_deadline()

    def _stop_deadline(self) -> None:
        if self._kill_at is None:
            self._kill_at = time.monotonic() + self.opt.grace_period_s + self.opt.kill_timeout_s + _LATE_S

    def exit_code(self) -> int:
        if self.signal_received is not None:
            return 128 + self.signal_received
        if self.lighthouse_failed is not None:
            return 1
        return self.first_failure or 0


def _fork_group(
    index: int,
    plan: LaunchPlan,
    options: SuperviseOptions,
    work: Path,
    report_path: str | None,
    stats: StatsOptions | None,
    exit_code_classes: bool,
    info: bool,
    gone: Callable[[], None] | None,
) -> _Group:
    """Fork group ``index``'s launcher: ``launch`` of its plan, its progress written for this
    process at its end (``GroupProgress``), its exit code the process's."""
    assert_single_threaded(f"fork replica group {index}'s launcher")
    group_options = dataclasses.replace(options, prefix_template=f"[group {index}] {options.prefix_template}")
    progress_path = work / f"group-{index}.json"
    group_report = group_report_path(report_path, index) if report_path else None
    for stream in (sys.stdout, sys.stderr):  # nothing of ours is written twice
        stream.flush()
    parent = os.getpid()
    # blocked across the fork: until the child has its own handlers, a signal to it would run ours
    # (it would write to this process's wakeup pipe: a stop of every group) and be lost to it
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise
    if pid == 0:  # the group's launcher: never returns into the caller's stack
        code = 1
        try:
            _become_group_launcher(parent)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            progress = GroupProgress([r.rank for r in plan.ranks], gone=gone)
            code = launch(
                plan,
                group_options,
                report_path=group_report,
                stats=stats,
                exit_code_classes=exit_code_classes,
                info=info,
                progress=progress,
            )
            write_atomic(progress_path, json.dumps(to_json(progress.result())))
        except OpenclawError as e:  # its port in use, ...: this group did not start
            say(options, f"openclaw-launch: replica group {index}: {e}")
            code = e.exit_code
        except BaseException:  # a bug: said on the shared stderr
            import traceback

            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return _Group(index, plan, pid, progress_path, group_report, gone)


def _become_group_launcher(parent: int) -> None:
    """Die with the launcher of the groups, in a session of its own, with the signals as a fresh
    launcher has them (job/launch.py installs its own)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the prctl
        os._exit(1)
    os.setsid()
    signal.set_wakeup_fd(-1)
    for sig in range(1, signal.NSIG):
        if sig not in (signal.SIGKILL, signal.SIGSTOP) and callable(signal.getsignal(sig)):
            signal.signal(sig, signal.SIG_DFL)


def _entry(group: _Group) -> GroupEntry:
    progress: Progress | None = None  # stays None when its launcher died before it wrote it
    with contextlib.suppress(OSError, ValueError, ReportShapeError):
        progress = from_json(Progress, json.loads(group.progress_path.read_text()))
    steps = progress.steps if progress is not None else ()
    report = group.report_path if group.report_path and os.path.exists(group.report_path) else None
    code = group.exit_code if group.exit_code is not None else 1
    return GroupEntry(group.index, group.plan.run_id, code, max(len(steps), 1), sum(steps), progress, report)


def _write_report(
    path: str,
    groups: ReplicaGroupsPlan,
    entries: tuple[GroupEntry, ...],
    run: _Run,
    code: int,
    options: SuperviseOptions,
) -> None:
    report = ReplicaGroupsReport(
        schema=SCHEMA,
        run_id=groups.node_plan.run_id,
        exit_code=code,
        signal_received=signal_name(run.signal_received) if run.signal_received is not None else None,
        lighthouse=groups.lighthouse.address,
        lighthouse_kind=groups.lighthouse.kind,
        lighthouse_failed=run.lighthouse_failed,
        groups=entries,
    )
    try:
        write_atomic(path, json.dumps(to_json(report), indent=2) + "\n")
    except OSError as e:
        say(
            options,
            f"openclaw-launch: error: cannot write the report {path}: {e.strerror or e}; exit code {code} stands",
        )
