"""``--prewarm``: workers forked by a zygote that imported the modules once (run/zygote.py), with
real launchers and real processes: each worker is what the plan's argv makes it (binding, memory
policy, session, environment, argv), the launcher's child, stopped and restarted as any worker, and
nothing outlives the launcher, the zygote included."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from guards import GUARD_S, wait_for
from host import free_port, listening

from openclaw_launch.config.prewarm import prewarm_modules
from openclaw_launch.plan.binding import numactl_argv
from openclaw_launch.plan.prewarm import NumactlFlags, prewarm_plan, read_numactl
from openclaw_launch.run import prewarm, zygote
from openclaw_launch.run.prewarm import Zygote, ZygoteUnusable

ROOT = Path(__file__).resolve().parent.parent
ZYGOTE_ARGV = "-m openclaw_launch.run.zygote"

# What a worker is, as it sees itself: written to OUT/<rank>-<attempt>.json, then the failure asked for.
PROBE = r"""
import ctypes, json, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
mode, mask = ctypes.c_int(-1), (ctypes.c_ulong * 16)()
nr = {"x86_64": 239, "aarch64": 236}[os.uname().machine]  # get_mempolicy
libc.syscall(nr, ctypes.byref(mode), mask, 16 * 64 + 1, None, 0)
torch = sys.modules.get("torch")
if os.environ.get("PROBE_TORCH"):
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    x = torch.ones(2) * (dist.get_rank() + 1)
    dist.all_reduce(x)
    dist.destroy_process_group()
rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
me = {
    "pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
    "cpus": sorted(os.sched_getaffinity(0)), "mempolicy": [mode.value, mask[0]],
    "argv": sys.argv, "file": __file__, "path0": sys.path[0], "cwd": os.getcwd(),
    "rank_env": {k: v for k, v in os.environ.items() if k.startswith(("RANK", "LOCAL_RANK", "OPENCLAW_CPUS", "PROBE"))},
    "environ_keys": sorted(os.environ), "cmdline": open("/proc/self/cmdline").read().split("\0"),
    "threads": torch.get_num_threads() if torch is not None else None,
    "sum": x.tolist() if os.environ.get("PROBE_TORCH") else None,
}
print(f"probe says hello", flush=True)
out = os.environ["PROBE_OUT"]
with open(os.path.join(out, f"{rank}-{attempt}.tmp"), "w") as f:
    json.dump(me, f)
os.replace(os.path.join(out, f"{rank}-{attempt}.tmp"), os.path.join(out, f"{rank}-{attempt}.json"))
if rank == os.environ.get("PROBE_FAIL_RANK") and attempt == "0":  # once every rank has said who it is
    while len([n for n in os.listdir(out) if n.endswith("-0.json")]) < int(os.environ["WORLD_SIZE"]):
        time.sleep(0.01)
    while os.environ.get("PROBE_GO") and not os.path.exists(os.environ["PROBE_GO"]):
        time.sleep(0.01)
    sys.exit(int(os.environ.get("PROBE_FAIL_CODE", "3")))
if os.environ.get("PROBE_SLEEP"):
    time.sleep(float(os.environ["PROBE_SLEEP"]))
"""


def _probe(tmp_path: Path) -> Path:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    (tmp_path / "out").mkdir(exist_ok=True)
    return script


def _launch(args: list[str], tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "openclaw_launch", *args],
        cwd=tmp_path,
        env={**os.environ, "PROBE_OUT": str(tmp_path / "out"), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the launcher hung")
    return proc.returncode, out, err


def _seen(tmp_path: Path, rank: int, attempt: int = 0) -> dict[str, object]:
    seen: dict[str, object] = json.loads((tmp_path / "out" / f"{rank}-{attempt}.json").read_text())
    return seen


def _descendants(pid: int) -> set[int]:
    """Every live process under ``pid`` (its tasks' children files)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                children = {int(c) for c in Path(f"/proc/{parent}/task/{task}/children").read_text().split()}
            except OSError:
                continue
            todo += list(children - found)
            found |= children
    return found


def _clear(tmp_path: Path) -> None:
    """The probes' files of the run before (a failing probe waits for its attempt's)."""
    for old in (tmp_path / "out").iterdir():
        old.unlink()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def test_a_prewarmed_worker_is_what_the_plan_argv_makes_it(tmp_path: Path) -> None:
    """The same ranks with and without --prewarm: binding, memory policy, argv, paths and environment
    alike; the prewarmed ones are the launcher's children in their own sessions, forked (cmdline)."""
    script = _probe(tmp_path)
    line = ["--nproc-per-node", "2", "--max-restarts", "1", str(script), "a", "b"]
    code, _, err = _finish(_launch(line, tmp_path, PROBE_FAIL_RANK="1"))
    assert code == 0, err
    plain = [_seen(tmp_path, r) for r in (0, 1)]
    _clear(tmp_path)
    proc = _launch(["--prewarm", "json", *line], tmp_path, PROBE_FAIL_RANK="1")
    code, out, err = _finish(proc)
    assert code == 0, err
    assert "attempt 2/2 after rank 1 exited 3" in err and "--prewarm off" not in err
    assert out.count("probe says hello") == 4 and "[rank 1]" in out  # prefixed as any worker's output
    for rank, before in enumerate(plain):
        for attempt in (0, 1):
            seen = _seen(tmp_path, rank, attempt)
            assert ZYGOTE_ARGV in " ".join(seen["cmdline"])  # type: ignore[arg-type]
            assert seen["ppid"] == proc.pid and seen["pgid"] == seen["pid"] == seen["sid"]
            for key in ("cpus", "mempolicy", "argv", "file", "path0", "cwd", "rank_env", "environ_keys"):
                assert seen[key] == before[key], key
    assert _seen(tmp_path, 0, 0)["pid"] != _seen(tmp_path, 0, 1)["pid"]


def test_exit_codes_sigterm_and_sigkill_of_the_launcher_leave_nothing_the_zygote_included(
    tmp_path: Path,
) -> None:
    script = _probe(tmp_path)
    code, _, err = _finish(
        _launch(["--prewarm", "json", "--nproc-per-node", "2", str(script)], tmp_path, PROBE_FAIL_RANK="0")
    )
    assert code == 3 and "rank 0" in err, err
    _clear(tmp_path)
    proc = _launch(["--prewarm", "json", "--nproc-per-node", "2", str(script)], tmp_path, PROBE_SLEEP="60")
    wait_for(lambda: len(list((tmp_path / "out").glob("*-0.json"))) == 2, "both ranks never started")
    family = _descendants(proc.pid)
    assert any(ZYGOTE_ARGV in _cmdline(p) for p in family), [_cmdline(p) for p in family]
    proc.send_signal(signal.SIGTERM)
    code, _, err = _finish(proc)
    assert code == 128 + signal.SIGTERM, err
    left = [(p, _cmdline(p)) for p in family if Path(f"/proc/{p}").exists()]
    assert not left
    _clear(tmp_path)
    proc = _launch(["--prewarm", "json", "--nproc-per-node", "2", str(script)], tmp_path, PROBE_SLEEP="60")
    wait_for(lambda: len(list((tmp_path / "out").glob("*-0.json"))) == 2, "both ranks never started")
    family = _descendants(proc.pid)
    proc.kill()  # SIGKILL: the zygote and the workers die with it (PR_SET_PDEATHSIG), the guardian cleans up
    _finish(proc)
    wait_for(lambda: not [p for p in family if _alive(p)], lambda: f"left: {[_cmdline(p) for p in family]}")


def test_a_standby_s_zygote_imports_while_it_waits_for_a_world(tmp_path: Path) -> None:
    """An elastic launcher starts its zygote before its wait for a world: a standby's is ready when a
    lost node's rank comes to it (its first workers do not wait for the imports). It dies with it."""
    script = _probe(tmp_path)
    port = free_port()
    line = ["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-id", "warm"]
    line += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", "last_call_timeout=1", "--max-restarts", "1"]
    go = tmp_path / "go"  # rank 0 of the host ends (exit 0) once this exists
    host = _launch([*line, str(script)], tmp_path, PROBE_FAIL_RANK="0", PROBE_FAIL_CODE="0", PROBE_GO=str(go))
    wait_for(lambda: listening(port), "the host never listened", poll_s=0.05)
    standby = _launch([*line, "--standby", "--prewarm", "json", str(script)], tmp_path, PROBE_SLEEP="60")

    def zygotes() -> list[int]:
        return [p for p in _descendants(standby.pid) if ZYGOTE_ARGV in _cmdline(p)]

    family = wait_for(zygotes, "the waiting standby started no zygote")
    assert not list((tmp_path / "out").glob("1-*.json"))  # it runs no rank: it waits for a lost node
    go.touch()
    code, _, err = _finish(host)
    assert code == 0, err
    code, _, err = _finish(standby)
    assert code == 0 and "ran no ranks" in err and "Traceback" not in err, err
    wait_for(lambda: not [p for p in family if _alive(p)], "the standby's zygote outlived it")


def test_gloo_ranks_restart_from_the_torch_zygote(tmp_path: Path) -> None:
    """Real torch: the zygote imported it once; the restarted ranks all-reduce, with the thread
    count OMP_NUM_THREADS gives a fresh process, and the report reads back each rank's CPUs."""
    script = _probe(tmp_path)
    report = tmp_path / "report.json"
    line = ["--prewarm", "torch", "--report", str(report), "--nproc-per-node", "2", "--max-restarts", "1"]
    code, _, err = _finish(_launch([*line, str(script)], tmp_path, PROBE_TORCH="1", PROBE_FAIL_RANK="1"))
    assert code == 0, err
    for rank in (0, 1):
        seen = _seen(tmp_path, rank, 1)
        assert seen["sum"] == [3.0, 3.0] and seen["threads"] == 1  # torch was there before the script
    ranks = json.loads(report.read_text())["ranks"]
    assert [r["bound_cpus"] for r in ranks] == [r["planned_cpus"] for r in ranks]


def test_an_import_that_fails_in_the_zygote_is_one_line_and_the_workers_start_exec_d(tmp_path: Path) -> None:
    script = _probe(tmp_path)
    code, _, err = _finish(
        _launch(["--prewarm", "no_such_module_here", "--nproc-per-node", "2", str(script)], tmp_path)
    )
    assert code == 0, err
    assert err.count("--prewarm off: import no_such_module_here failed in the zygote") == 1, err
    assert ZYGOTE_ARGV not in " ".join(_seen(tmp_path, 1)["cmdline"])  # type: ignore[arg-type]


def test_a_zygote_gone_mid_run_is_one_line_and_the_restart_starts_exec_d(tmp_path: Path) -> None:
    script = _probe(tmp_path)
    go = tmp_path / "go"
    line = ["--prewarm", "json", "--nproc-per-node", "2", "--max-restarts", "1", str(script)]
    proc = _launch(line, tmp_path, PROBE_FAIL_RANK="1", PROBE_GO=str(go))
    wait_for(lambda: len(list((tmp_path / "out").glob("*-0.json"))) == 2, "both ranks never started")
    workers = {_seen(tmp_path, rank)["pid"] for rank in (0, 1)}  # forked: the zygote's cmdline too
    zygote_pid = next(p for p in _descendants(proc.pid) - workers if ZYGOTE_ARGV in _cmdline(p))
    os.kill(zygote_pid, signal.SIGKILL)
    wait_for(lambda: not _alive(zygote_pid), "the zygote was never collected")
    go.touch()
    code, _, err = _finish(proc)
    assert code == 0, err
    assert err.count(f"--prewarm off: the zygote (pid {zygote_pid}) ended with -9") == 1, err
    for rank in (0, 1):
        assert ZYGOTE_ARGV not in " ".join(_seen(tmp_path, rank, 1)["cmdline"])  # type: ignore[arg-type]


def test_prewarm_is_refused_where_no_zygote_can_stand_for_the_command(tmp_path: Path) -> None:
    for args, words in (
        (["--prewarm", "torch", "--no-python", "true"], "--prewarm (runtime.prewarm) needs a Python entry"),
        (["--prewarm", "torch;rm", "x.py"], "not a module name: torch;rm"),
    ):
        code, _, err = _finish(_launch(["plan", "--nproc-per-node", "1", *args], tmp_path))
        assert code == 2 and words in err, err
    config = "cluster:\n  nodes:\n    - name: here\n      cpu_workers: 1\nruntime:\n  prewarm: {}\n"
    (tmp_path / "bad.yaml").write_text(config.format('"torch;rm"'))
    code, _, err = _finish(_launch(["plan", "--config", "bad.yaml", "x.py"], tmp_path))
    assert code == 2 and "runtime.prewarm (line 6)" in err and "not a module name: torch;rm" in err, err
    (tmp_path / "good.yaml").write_text(config.format("[numpy, torch]"))
    code, out, err = _finish(_launch(["plan", "--json", "--config", "good.yaml", "x.py"], tmp_path))
    assert json.loads(out)["prewarm"]["modules"] == ["numpy", "torch"], err
    line = ["plan", "--json", "--config", "good.yaml", "--prewarm", "torch", "x.py"]  # the flag wins
    code, out, err = _finish(_launch(line, tmp_path))
    prewarm = json.loads(out)["prewarm"]
    assert prewarm["modules"] == ["torch"]
    assert prewarm["argv"][1:] == ["-u", "-m", "openclaw_launch.run.zygote", "torch"]
    assert json.loads(out)["ranks"][0]["argv"][-len(prewarm["entry"]) :] == prewarm["entry"]


def test_the_numactl_flags_the_plan_writes_are_read_back_whole() -> None:
    assert read_numactl(numactl_argv((0, 1, 4), "bind", (0, 1), "numactl")) == NumactlFlags(
        (0, 1, 4), (), "bind", (0, 1)
    )
    assert read_numactl(numactl_argv((), "preferred", (1,), "numactl", (1,))) == NumactlFlags(
        (), (1,), "preferred", (1,)
    )
    assert read_numactl(numactl_argv((2,), "local", (), "numactl")) == NumactlFlags((2,), (), "local", ())
    assert read_numactl(["numactl", "--interleave=all"]) is None
    assert prewarm_modules(" torch, numpy,torch ") == ("torch", "numpy")
    with pytest.raises(ValueError, match="module names"):
        prewarm_modules(",")


def test_the_zygote_refuses_to_fork_with_a_second_thread() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        problem = zygote.unsafe_to_fork()
    finally:
        stop.set()
        thread.join()
    assert problem is not None and "threads after its imports" in problem


def test_a_zygote_that_does_not_answer_in_time_is_killed_so_it_never_forks_the_worker_late(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher spawns that worker directly: a stalled zygote that served the request later
    would fork a second one beside it."""
    script = tmp_path / "nothing.py"
    script.write_text("")
    plan = prewarm_plan(("json",), "script", (sys.executable, "-u", str(script)))
    said: list[str] = []
    server = Zygote.start(plan, dict(os.environ), said.append)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        assert server.spawn(plan.entry, dict(os.environ), null, null, None) > 0  # it serves
        os.kill(server.pid, signal.SIGSTOP)  # then stalls with the next request unread
        monkeypatch.setattr(prewarm, "ANSWER_TIMEOUT_S", 0.5)
        with pytest.raises(ZygoteUnusable, match="did not answer within 0.5 s"):
            server.spawn(plan.entry, dict(os.environ), null, null, None)
        wait_for(lambda: not _alive(server.pid), "the stalled zygote was left alive")
        _, status = os.waitpid(server.pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
        server.died(status)
    finally:
        os.close(null)
        server.close()  # nothing left if an assertion failed first: a zygote not collected is SIGKILLed
    assert len(said) == 1 and "did not answer within 0.5 s" in said[0], said
