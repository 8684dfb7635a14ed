"""One job of N nodes on this machine: N launchers on loopback, one trivial worker each
(benchmarks/scale_worker.py, standard library only), under openclaw-launch and torchrun's c10d
rendezvous, interleaved in one run (issue 29).

Per launcher and N, one line each of:

- ``start``: static ``--nnodes N --rdzv-backend c10d``: the first launcher's start -> every
  worker running (its ready file written); then each launcher's RSS (the launcher and its own
  helpers, not the worker) and its CPU over an idle window of ``--idle-s``; then ``fate``: one
  rank exits 3 -> every launcher gone, and their exit codes.
- ``reform``: elastic ``--nnodes 1:N``: once every worker runs, one node (its launcher and every
  process under it) is SIGKILLed -> every survivor's worker of the new world running.
- ``phases`` (ours only): static, ``LOGLEVEL=INFO``, each launcher's lines stamped as read
  (benchmarks/scale_phases.py): the start split into each node's own part and the wait that grows
  with N; then every worker steps (``--step-s``, ``telemetry.step()``) with ``--stats-interval-s``,
  and once node 0's ``job stats:`` line judges, rank N/2 sleeps ``--slow-s`` more a step: ``live``,
  from its first slow step to node 0's line naming it (``named_before``: lines naming any straggler
  before); with ``--hold-s S`` the job steps S more, then: ``job_lines`` (node 0's, from its first
  judged line), ``job_line_max_gap_s`` (the longest wait for the next), ``no_verdict_lines``,
  ``store_conns`` (the store's established connections then) and ``store_conns_new`` (those not there
  at the first judged line: a node that connected again), ``store_notes`` (the launchers' warnings
  that a job-live connection was lost or given up); then every worker ends (``DIR/stop``):
  ``merge``, from the last worker's exit to node 0's ``--job-report`` written (its mtime), and every
  launcher gone.

``store``: over the same idle window, the requests (TCP data segments in: one per request of
either store client) and the bytes both ways on every server-side connection of the endpoint's
port (``ss -ti``), per second: the agents' (or torchrun's rendezvous's) whole traffic.
``--netns-nodes M`` runs M of the launchers in network namespaces joined by veth pairs
(benchmarks/scale_netns.py; root): their addresses differ from the store's, their traffic crosses
a link; every launcher's endpoint is then ``10.78.1.1``.

``SCALE_KEEP_DIR=DIR`` keeps a failed re-forming's (or phases') directory (the launchers' logs) under DIR.

``--served-store`` keeps every openclaw agent's store in one serving process
(openclaw_launch/agents/served_store.py) so that N helpers do not each import torch on this one
machine (at real scale each node pays its own import, on its own host); without it the helpers'
torch imports are part of the numbers.

    python benchmarks/scale.py [--nodes 8,32] [--launchers ours,torchrun] [--scenarios start,reform]
        [--torchrun-max-nodes 32] [--served-store] [--netns-nodes 0] [--idle-s 5] [--timeout-s 600]
        [--react-timeout-s 60] [--step-s 0.1] [--slow-s 0.1] [--stats-interval-s 1] [--hold-s 0]

prints one line per run and a markdown table at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
from scale_netns import ENDPOINT, inside, namespaces
from scale_phases import Stamper, first, has_lines, held, live_verdict, merge, node_zero, peers, stamped, start_split

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "benchmarks" / "scale_worker.py")
SERVED_ENV = "OPENCLAW_AGENT_STORE_SERVER"
JUDGED = re.compile(r"job stats: .*; (no straggler|straggler:)")  # node 0's live line, judged
KEEP_ENV = "SCALE_KEEP_DIR"  # where a failed re-forming's (or phases') directory is copied (its launchers' logs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(
    which: str, nnodes: str, endpoint: str, directory: Path, fail_rank: int, phases: argparse.Namespace | None
) -> list[str]:
    line = ["--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
    restarts = "3" if ":" in nnodes else "0"  # static: one rank's failure ends the job (one fate)
    line += ["--rdzv-endpoint", endpoint, "--max-restarts", restarts]
    head = [sys.executable, "-m", "openclaw_launch"] if which == "ours" else ["torchrun"]
    worker = [WORKER, str(directory), "--fail-rank", str(fail_rank)]
    if phases is not None:  # stepping workers, one of them slowed later; the job report on node 0
        line += ["--stats-interval-s", str(phases.stats_interval_s), "--job-report", str(directory / "job.json")]
        worker += ["--step-s", str(phases.step_s), "--slow-rank", str(phases.slow_rank), "--slow-s", str(phases.slow_s)]
    return [*head, *line, *worker]


def wait(condition: Callable[[], bool], timeout_s: float, poll_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return False


def ready(directory: Path, since: float = 0.0) -> int:
    """How many workers wrote their ready file after ``since`` (a ``time.time()``): torchrun keeps
    TORCHELASTIC_RESTART_COUNT at 0 across a membership change, so the time tells a new world's
    workers from the old one's."""
    count = 0
    for path in directory.glob("ready-*-*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            count += float(path.read_text().split()[0]) > since
    return count


def ready_times(directory: Path) -> dict[int, float]:
    """Each rank's first worker's ready time (``time.time()``)."""
    out = {}
    for path in directory.glob("ready-*-0"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            out[int(path.name.split("-")[1])] = float(path.read_text().split()[0])
    return out


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def own_processes(pid: int) -> list[psutil.Process]:
    """The launcher and its helpers: its tree less the workers (and what they started)."""
    procs = tree(pid)
    workers = set()
    for p in procs:
        with contextlib.suppress(psutil.Error):
            cmd = p.cmdline()  # the launcher's own line names the worker's script too
            if WORKER in cmd and not any("openclaw_launch" in part or "torchrun" in part for part in cmd):
                workers |= {p.pid, *(c.pid for c in p.children(recursive=True))}
    return [p for p in procs if p.pid not in workers]


def cpu_s(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def rss_mib(procs: list[psutil.Process]) -> float:
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total / 2**20


def store_traffic(port: int) -> tuple[int, int]:
    """(requests, bytes both ways) so far on every established server-side connection of ``port``:
    ``ss``'s data segments in (each client sends a request in one segment) and bytes."""
    out = subprocess.run(
        ["ss", "-tinH", "state", "established", f"( sport = :{port} )"], capture_output=True, text=True, timeout=30
    ).stdout
    requests = sum(int(x) for x in re.findall(r"\bdata_segs_in:(\d+)", out))
    moved = sum(int(x) for x in re.findall(r"\bbytes_(?:received|acked):(\d+)", out))
    return requests, moved


def kill_tree(pid: int) -> None:
    for p in tree(pid):
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)


@contextlib.contextmanager
def served_store(enabled: bool, directory: Path) -> Iterator[dict[str, str]]:
    if not enabled:
        yield {}
        return
    path = directory / "stores.sock"
    server = subprocess.Popen([sys.executable, "-m", "openclaw_launch.agents.served_store", str(path)])
    try:
        wait(path.exists, 60)
        yield {SERVED_ENV: str(path)}
    finally:
        server.kill()
        server.wait()


class Job:
    """N launchers of one job, their output in files (nothing to drain)."""

    def __init__(
        self,
        which: str,
        n: int,
        elastic: bool,
        directory: Path,
        env: dict[str, str],
        netns: list[str],
        in_ns: int,
        phases: argparse.Namespace | None = None,
    ) -> None:
        """``in_ns`` of the ``n`` launchers (the last ones) run in the namespaces ``netns``, round-robin;
        ``phases``: the ``phases`` scenario's knobs (the launchers' lines stamped, ``self.execs``)."""
        self.which, self.n, self.directory = which, n, directory
        self.port = port = free_port()
        endpoint = f"{ENDPOINT if netns else '127.0.0.1'}:{port}"
        nnodes = f"1:{n}" if elastic else str(n)
        fail_rank = -1 if elastic or phases is not None else n // 2
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "SLURM", "TORCHELASTIC"))}
        environ.update(env, PYTHONPATH=str(ROOT))
        if phases is not None:
            environ["LOGLEVEL"] = "INFO"  # job/info_log.py: the rendezvous's result, each worker's spawn
        self.logs = [directory / f"launcher-{node}.log" for node in range(n)]
        self.started = time.monotonic()
        self.execs: list[float] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        for node in range(n):
            with open(self.logs[node], "wb") as log:
                ns = netns[node % len(netns)] if netns and node >= n - in_ns else None
                cmd = command(which, nnodes, endpoint, directory, fail_rank, phases)
                if netns and which == "torchrun":  # by its c10d rule only the hostname's addresses host
                    cmd[1:1] = ["--rdzv-conf", f"is_host={'true' if node == 0 else 'false'}"]
                cmd = inside(ns, cmd)
                out = subprocess.PIPE if phases is not None else log
                self.execs.append(time.time())
                self.procs.append(
                    subprocess.Popen(cmd, cwd=directory, env=environ, stdout=out, stderr=subprocess.STDOUT)
                )
        self.stamper = None
        if phases is not None:
            self.stamper = Stamper([p.stdout for p in self.procs if p.stdout is not None], self.logs)

    def tail(self) -> str:
        logs = sorted(self.directory.glob("launcher-*.log"))
        return logs[0].read_text(errors="replace")[-1500:] if logs else ""

    def stop(self) -> None:
        (self.directory / "stop").touch()
        if not wait(lambda: all(p.poll() is not None for p in self.procs), 60):
            for p in self.procs:
                kill_tree(p.pid)
        for p in self.procs:
            p.wait()
        if self.stamper is not None:
            self.stamper.join(10)


@contextlib.contextmanager
def running(
    which: str,
    n: int,
    elastic: bool,
    served: bool,
    timeout_s: float,
    in_ns: int,
    phases: argparse.Namespace | None = None,
) -> Iterator[tuple[Job, float | str]]:
    """A job of ``n`` launchers (``in_ns`` of them in network namespaces), and how long until every
    worker ran (or why it did not); stopped and its directory removed at the end."""
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="scale-"))
        env = stack.enter_context(served_store(served, Path(tmp)))
        netns = stack.enter_context(namespaces(in_ns > 0))
        job = Job(which, n, elastic, Path(tmp), env, netns, in_ns, phases)
        try:
            if wait(lambda: ready(job.directory) >= n, timeout_s):
                yield job, time.monotonic() - job.started
            else:
                yield job, f"only {ready(job.directory)} of {n} workers ran in {timeout_s:g} s"
        finally:
            job.stop()


def run_start(
    which: str, n: int, served: bool, idle_s: float, timeout_s: float, fate_s: float, in_ns: int
) -> dict[str, object]:
    with running(which, n, False, served, timeout_s, in_ns) as (job, start_s):
        if isinstance(start_s, str):
            return {"error": start_s}
        owns = [own_processes(p.pid) for p in job.procs]
        before = [cpu_s(o) for o in owns]
        requests, moved = store_traffic(job.port)
        time.sleep(idle_s)
        idle = [(cpu_s(o) - b) / idle_s * 100 for o, b in zip(owns, before, strict=True)]
        requests_after, moved_after = store_traffic(job.port)
        rss = [rss_mib(o) for o in owns]
        result: dict[str, object] = {
            "start_s": start_s,
            "rss_mib_max": max(rss),
            "rss_mib_median": sorted(rss)[n // 2],
            "idle_cpu_pct_mean": sum(idle) / n,
            "idle_cpu_pct_max": max(idle),
            "store_req_per_s": (requests_after - requests) / idle_s,
            "store_kib_per_s": (moved_after - moved) / idle_s / 1024,
        }
        go = time.monotonic()
        (job.directory / "go-0").touch()
        if not wait(lambda: all(p.poll() is not None for p in job.procs), fate_s):
            alive = sum(p.poll() is None for p in job.procs)
            return {**result, "error": f"{alive} of {n} launchers still ran {fate_s:g} s after the failure"}
        return {**result, "fate_s": time.monotonic() - go, "exit_codes": sorted({p.returncode for p in job.procs})}


def keep(job: Job, name: str) -> None:
    """A failed run's directory (the launchers' logs, to see why) under ``SCALE_KEEP_DIR`` if set."""
    if KEEP_ENV in os.environ:
        shutil.copytree(job.directory, Path(os.environ[KEEP_ENV]) / name, dirs_exist_ok=True)


def run_reform(which: str, n: int, served: bool, timeout_s: float, react_s: float, in_ns: int) -> dict[str, object]:
    with running(which, n, True, served, timeout_s, in_ns) as (job, start_s):
        if isinstance(start_s, str):
            return {"error": start_s}
        killed, killed_at = time.monotonic(), time.time()
        kill_tree(job.procs[n // 2].pid)
        if not wait(lambda: ready(job.directory, killed_at) >= n - 1, react_s):
            count = ready(job.directory, killed_at)
            keep(job, f"reform-{which}-{n}")
            return {"start_s": start_s, "error": f"{count} of {n - 1} re-formed in {react_s:g} s"}
        return {"start_s": start_s, "reform_s": time.monotonic() - killed}


def run_phases(
    n: int, served: bool, timeout_s: float, react_s: float, in_ns: int, knobs: argparse.Namespace
) -> dict[str, object]:
    phases = argparse.Namespace(**vars(knobs), slow_rank=n // 2)
    with running("ours", n, False, served, timeout_s, in_ns, phases) as (job, start_s):
        if isinstance(start_s, str):
            return {"error": start_s}
        wait(lambda: has_lines(job.logs), 10, 0.2)
        result: dict[str, object] = {"start_s": start_s, **start_split(job.execs, job.logs, ready_times(job.directory))}
        zero = node_zero(job.logs)
        if zero is None:
            return {**result, "error": "no launcher said it is node rank 0"}
        log = job.logs[zero]
        (job.directory / "go-0").touch()
        if not wait(lambda: first(stamped(log), JUDGED) is not None, react_s, 0.2):
            keep(job, f"phases-{n}")
            said = sum("job stats:" in text for _, text in stamped(log))
            return {**result, "error": f"node 0's job line judged nothing in {react_s:g} s ({said} job line(s))"}
        judged = first(stamped(log), JUDGED)
        assert judged is not None
        before = peers(job.port)
        (job.directory / "slow").touch()
        slowed = job.directory / "slowed"
        if not wait(slowed.exists, react_s):
            return {**result, "error": f"rank {n // 2} did not slow down in {react_s:g} s"}
        slow_at = float(slowed.read_text())
        naming = re.compile(rf"job stats: .*; straggler: node \S+ rank {n // 2} \(")
        wait(lambda: first(stamped(log), naming, slow_at) is not None, react_s, 0.2)
        result.update(live_verdict(stamped(log), naming, slow_at, react_s))
        time.sleep(knobs.hold_s)  # the window whose job lines are counted
        result.update(held(stamped(log), job.logs, judged[0], peers(job.port), before))
        stopped = time.monotonic()
        (job.directory / "stop").touch()
        if not wait(lambda: all(p.poll() is not None for p in job.procs), react_s):
            return {**result, "error": f"launchers still ran {react_s:g} s after the workers' end"}
        result["all_gone_s"] = time.monotonic() - stopped
        result.update(merge(job.directory, n))
        return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="8,32")
    p.add_argument("--launchers", default="ours,torchrun")
    p.add_argument("--scenarios", default="start,reform")
    p.add_argument("--torchrun-max-nodes", type=int, default=32)
    p.add_argument("--served-store", action="store_true")
    p.add_argument("--netns-nodes", type=int, default=0, help="launchers run in network namespaces (root)")
    p.add_argument("--idle-s", type=float, default=5.0)
    p.add_argument("--timeout-s", type=float, default=600.0)
    p.add_argument(
        "--react-timeout-s",
        type=float,
        default=60.0,
        help="how long the launchers may take to end after a failure, or to re-form after a loss",
    )
    p.add_argument("--step-s", type=float, default=0.1, help="phases: each worker's step (a sleep)")
    p.add_argument("--slow-s", type=float, default=0.1, help="phases: what rank N/2 sleeps more a step")
    p.add_argument("--stats-interval-s", type=float, default=1.0, help="phases: the launchers' live line")
    p.add_argument("--hold-s", type=float, default=0.0, help="phases: how long the job steps on once named")
    args = p.parse_args()
    knobs = argparse.Namespace(
        step_s=args.step_s, slow_s=args.slow_s, stats_interval_s=args.stats_interval_s, hold_s=args.hold_s
    )
    rows: list[tuple[str, int, str, dict[str, object]]] = []
    for n in (int(x) for x in args.nodes.split(",")):
        for scenario in args.scenarios.split(","):
            for which in args.launchers.split(","):  # interleaved: both launchers at one N, then the next
                if which == "torchrun" and (n > args.torchrun_max_nodes or scenario == "phases"):
                    continue
                served = args.served_store and which == "ours"
                if scenario == "start":
                    react_s, in_ns = args.react_timeout_s, min(args.netns_nodes, n - 1)
                    result = run_start(which, n, served, args.idle_s, args.timeout_s, react_s, in_ns)
                elif scenario == "phases":
                    in_ns = min(args.netns_nodes, n - 1)
                    result = run_phases(n, served, args.timeout_s, args.react_timeout_s, in_ns, knobs)
                else:
                    in_ns = min(args.netns_nodes, n - 1)
                    result = run_reform(which, n, served, args.timeout_s, args.react_timeout_s, in_ns)
                rows.append((which, n, scenario, result))
                print(f"{which:8} N={n:<4} {scenario:7} {result}", flush=True)
    print("\n| launcher | N | scenario | result |\n|---|---|---|---|")
    for which, n, scenario, result in rows:
        text = ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items())
        print(f"| {which} | {n} | {scenario} | {text} |")


if __name__ == "__main__":
    main()
