"""The agents' membership with real launchers on loopback: node ranks by arrival (torchrun's c10d
line without --node-rank, the `srun torchrun` recipe), each node admitted once, a port that
answers but is no agent, what a waiting launcher says, and configs that differ by a comment.
Workers are tests/fake_worker.py and tests/compat_worker.py (no torch in them)."""

from __future__ import annotations

import http.server
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from guards import GUARD_S, read_until, wait_for
from host import free_port, listening, needs_torch
from test_agents_loopback import CONFIG, FAKE, finish, start, wait_files
from torchrun_recording import SIDES, torchrun_side

ROOT = Path(__file__).resolve().parent.parent
COMPAT = [str(ROOT / "tests" / "compat_worker.py")]
pytestmark = needs_torch  # the agents meet through torch's TCPStore

# compared per rank with torchrun's (the ids and ports differ by design: docs/torchrun-compat.md)
COMPARED = "RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK ROLE_WORLD_SIZE".split()


def c10d_line(port: int, nnodes: int, nproc: int, extra: Sequence[str] = ()) -> list[str]:
    """The `srun torchrun` recipe's line: no --node-rank, the rendezvous on HEAD:PORT."""
    line = ["--nnodes", str(nnodes), "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d"]
    return [*line, "--rdzv-endpoint", f"127.0.0.1:{port}", *extra]


def popen(cmd: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "SLURM"))}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    return subprocess.Popen(
        list(cmd), cwd=ROOT, env={**environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def run_to_end(cmd: Sequence[str]) -> subprocess.CompletedProcess[str]:
    proc = popen(cmd)
    stdout, stderr = proc.communicate(timeout=GUARD_S)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def ours(*args: str) -> list[str]:
    return [sys.executable, "-m", "openclaw_launch", *args]


def collect(procs: Sequence[subprocess.Popen[str]], early: Sequence[str]) -> list[tuple[int, str]]:
    """Each launcher's exit code and all it said: what ``read_until`` read of it early, then the rest."""
    out = []
    for proc, seen in zip(procs, early, strict=True):
        stdout, stderr = proc.communicate(timeout=GUARD_S)
        out.append((proc.returncode, seen + stdout + stderr))
    return out


@pytest.fixture
def reaped() -> Iterator[list[subprocess.Popen[str]]]:
    """Launchers a failed assertion must not leave behind."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=GUARD_S)


def env_of(path: Path) -> dict[str, str]:
    return dict(json.loads(path.read_text())["environ"])


# ---- node ranks by arrival (issue 19 item 3) ---------------------------------------------------


def test_three_launchers_in_shuffled_order_take_node_ranks_by_arrival_and_keep_them_on_restart(
    tmp_path: Path, reaped: list[subprocess.Popen[str]]
) -> None:
    """Each launcher is started once the one before it has its node rank: launcher k (in the
    shuffled order) is node rank k; rank 5 fails in attempt 0, the job restarts once, and every
    node keeps its rank (attempt 1's variables are attempt 0's)."""
    port = free_port()
    names = ["a", "b", "c"]
    random.shuffle(names)
    early: list[str] = []
    for arrival, name in enumerate(names):
        worker = [*FAKE, "--write-env", f"{tmp_path}/{name}-{{rank}}-{{attempt}}.json"]
        worker += ["--only-rank", "5", "--fail-below-attempt", "1", "--exit", "3"]
        if arrival == 2:  # rank 5 fails once ranks 0-4 wrote their files (else one may be stopped first)
            for rank in range(5):
                worker += ["--wait-for", f"{tmp_path}/{names[rank // 2]}-{rank}-{{attempt}}.json"]
        line = c10d_line(port, 3, 2, ["--max-restarts", "1", "--telemetry", "off", "--keepalive-s", "2"])
        reaped.append(popen(ours(*line, "--no-python", "--", *worker)))
        early.append(read_until(reaped[-1], "node rank"))
    results = collect(reaped, early)
    assert [code for code, _ in results] == [0, 0, 0], results
    master_ports = set()
    for node_rank, (name, (_, text)) in enumerate(zip(names, results, strict=True)):
        assert f"node rank {node_rank} of 3 (by arrival at 127.0.0.1:{port})" in text
        for attempt in (0, 1):
            files = sorted(tmp_path.glob(f"{name}-*-{attempt}.json"))
            envs = [env_of(f) for f in files]
            assert [(e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"], e["WORLD_SIZE"]) for e in envs] == [
                (str(2 * node_rank + local), str(local), str(node_rank), "6") for local in (0, 1)
            ], (name, attempt)
            assert {e["OPENCLAW_NODE_RANK"] for e in envs} == {str(node_rank)}
            master_ports |= {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}
    [(addr, master_port)] = master_ports  # node rank 0's free port, the same on every node
    assert addr == "127.0.0.1" and master_port != str(port)


@pytest.mark.usefixtures("served_agent_stores")
@pytest.mark.parametrize("side", SIDES)
def test_the_same_line_under_torchrun_gives_every_rank_the_same_variables(tmp_path: Path, side: str) -> None:
    """Three torchrun launchers (or their recording: tests/torchrun_recording.py) and three of ours,
    the same c10d line: every rank's variables agree (which launcher gets which node rank differs:
    torchrun sorts the nodes by host name and pid, ours by arrival, docs/torchrun-compat.md), and
    each launcher's ranks are one node's."""

    def three_launchers(which: str, cmd: list[str]) -> dict[str, dict[str, str]]:
        """Every rank's variables, by rank, of three launchers of the line at once."""
        port = free_port()
        procs = []
        for k in range(3):
            out = tmp_path / which / str(k)
            out.mkdir(parents=True)
            procs.append(popen([*cmd, *c10d_line(port, 3, 2), *COMPAT, "--dump", str(out)]))
        results = collect(procs, ["" for _ in procs])
        assert [code for code, _ in results] == [0, 0, 0], results
        dumps = {}
        for k in range(3):
            ranks = {
                p.stem.split("-")[1]: json.loads(p.read_text()) for p in (tmp_path / which / str(k)).glob("rank-*.json")
            }
            assert len({r["GROUP_RANK"] for r in ranks.values()}) == 1 and len(ranks) == 2, (which, k, ranks)
            dumps.update(ranks)
        return dumps

    def torchruns() -> dict[str, dict[str, str | None]]:
        dumps = three_launchers("torchrun", [sys.executable, "-m", "torch.distributed.run"])
        return {rank: {k: env.get(k) for k in COMPARED} for rank, env in dumps.items()}

    theirs = torchrun_side("membership/three_launchers_c10d", side, torchruns)
    mine = three_launchers("ours", ours())
    assert sorted(mine, key=int) == sorted(theirs, key=int) == [str(rank) for rank in range(6)]
    for rank, variables in theirs.items():
        assert {k: mine[rank].get(k) for k in COMPARED} == variables, rank
    assert len({r["MASTER_PORT"] for r in mine.values()}) == 1


@pytest.mark.usefixtures("served_agent_stores")
def test_a_launcher_too_many_is_refused_and_the_job_finishes(
    tmp_path: Path, reaped: list[subprocess.Popen[str]]
) -> None:
    port = free_port()
    worker = [*FAKE, "--ready-file", f"{tmp_path}/ready-{{rank}}", "--wait-for", f"{tmp_path}/go"]
    line = c10d_line(port, 2, 1, ["--telemetry", "off", "--keepalive-s", "2"])
    for _ in range(2):
        reaped.append(popen(ours(*line, "--no-python", "--", *worker)))
    wait_files([tmp_path / "ready-0", tmp_path / "ready-1"], {str(i): p for i, p in enumerate(reaped)})
    extra = run_to_end(ours(*line, "--no-python", "--", *FAKE, "--ready-file", f"{tmp_path}/extra-{{rank}}"))
    assert extra.returncode == 2, extra.stderr
    assert "has its 2 node(s) already" in extra.stderr and "refused" in extra.stderr and "Traceback" not in extra.stderr
    assert not list(tmp_path.glob("extra-*"))
    (tmp_path / "go").write_text("")
    results = collect(reaped, ["", ""])
    assert [code for code, _ in results] == [0, 0], results


# ---- each node admitted once (issue 21 item 2) -------------------------------------------------


@pytest.mark.parametrize("node", ["node1", "node0"])
def test_a_second_launcher_for_a_joined_node_is_refused_and_the_job_finishes(tmp_path: Path, node: str) -> None:
    """A copy of a node's launcher while the job runs: exit 2 with the reason, no worker of its
    own, and the real two-node job goes on to exit 0 on both nodes."""
    worker = ["--ready-file", f"{tmp_path}/ready-{{rank}}", "--wait-for", f"{tmp_path}/go"]
    procs = start(tmp_path, worker)
    try:
        wait_files([tmp_path / f"ready-{r}" for r in range(3)], procs)
        real = procs["node0"].args
        assert isinstance(real, list)
        copy = [*real]
        copy[copy.index("--node") + 1] = node
        copy[copy.index("--report") + 1] = str(tmp_path / "report-copy.json")
        copy = [a.replace(f"{tmp_path}/ready-", f"{tmp_path}/copy-") for a in copy]
        dup = run_to_end(copy)
        assert dup.returncode == 2, dup.stderr
        if node == "node1":
            assert "node node1 (node rank 1) already joined this job" in dup.stderr
        else:  # node0's ports are the job's: the workers' store (MASTER_PORT) is bound first
            assert "in use" in dup.stderr and ("--master-port" in dup.stderr or "hosts agents there" in dup.stderr)
        assert "refused" in dup.stderr or "in use" in dup.stderr
        assert "Traceback" not in dup.stderr and not list(tmp_path.glob("copy-*"))
        assert all(p.poll() is None for p in procs.values())  # the job is untouched
        (tmp_path / "go").write_text("")
        results = finish(procs)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    assert [code for code, _ in results.values()] == [0, 0], results


# ---- the agents' waiting (issue 21 item 7) -----------------------------------------------------


class _Http(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(params=["plain-listen", "http"])
def not_an_agent(request: pytest.FixtureRequest) -> Iterator[int]:
    """A port that accepts connections but is no agent."""
    if request.param == "http":
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Http)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield int(server.server_address[1])
        server.shutdown()
        server.server_close()
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            yield int(s.getsockname()[1])


@pytest.mark.parametrize("how", ["config-node1", "c10d-by-arrival"])
def test_a_port_that_answers_but_is_no_agent_is_an_error_within_the_agent_timeout(
    tmp_path: Path, not_an_agent: int, how: str
) -> None:
    if how == "config-node1":
        line = ["--config", str(CONFIG), "--node", "node1", "--agent-port", str(not_an_agent)]
    else:
        line = c10d_line(not_an_agent, 2, 1)
    cmd = ours(*line, "--agent-timeout-s", "6", "--telemetry", "off", "--no-python", "--", *FAKE)
    cmd += ["--ready-file", f"{tmp_path}/ready-{{rank}}"]
    done = run_to_end(cmd)
    assert done.returncode == 2, done.stderr
    said = (  # the launcher's own count, or its helper's client giving up at the same bound
        f"no agent answered at 127.0.0.1:{not_an_agent} within 6 s (--agent-timeout-s)",
        f"cannot reach the first node's agent at 127.0.0.1:{not_an_agent} within 6 s",
    )
    assert any(text in done.stderr for text in said), done.stderr
    assert "waiting for the first node's agent" in done.stderr  # said every few seconds meanwhile
    assert "Traceback" not in done.stderr and not list(tmp_path.glob("ready-*"))


def test_a_waiting_launcher_says_what_it_waits_for(tmp_path: Path, reaped: list[subprocess.Popen[str]]) -> None:
    """A config's node1 started first waits for the first node's agent and says so; the first
    launcher of a two-node arrival job waits for node1 and names it, with the time left."""
    master, agent = str(free_port()), str(free_port())
    early = ["", ""]
    for i, node in enumerate(("node1", "node0")):
        cmd = ours("--config", str(CONFIG), "--node", node, "--master-port", master, "--agent-port", agent)
        cmd += ["--run-id", "waits", "--telemetry", "off", "--agent-timeout-s", "60", "--no-python", "--", *FAKE]
        if i == 0:
            reaped.append(popen(cmd))
            early[0] = read_until(reaped[0], f"waiting for the first node's agent at 127.0.0.1:{agent}")
            assert "s left (--agent-timeout-s)" in early[0].splitlines()[-1]
        else:
            reaped.append(popen(cmd))
    results = collect(reaped, early)
    assert [code for code, _ in results] == [0, 0], results
    port = free_port()
    first = popen(ours(*c10d_line(port, 2, 1, ["--telemetry", "off"]), "--no-python", "--", *FAKE))
    reaped[:] = [first]
    seen = read_until(first, "waiting for node(s) node1 (1 of 2 here) at 127.0.0.1:")
    assert "s left (--agent-timeout-s)" in seen.splitlines()[-1]
    reaped.append(popen(ours(*c10d_line(port, 2, 1, ["--telemetry", "off"]), "--no-python", "--", *FAKE)))
    results = collect(reaped, [seen, ""])
    assert [code for code, _ in results] == [0, 0], results


@pytest.mark.usefixtures("served_agent_stores")
def test_configs_that_differ_only_by_comments_agree(tmp_path: Path) -> None:
    text = CONFIG.read_text()
    commented = tmp_path / "commented.yaml"
    commented.write_text(
        "# one more comment line\n\n"
        + text.replace("    - name: node1\n", "    # the second node\n    - name: node1\n")
    )
    procs = start(tmp_path, [], config={"node0": CONFIG, "node1": commented})
    results = finish(procs)
    assert [code for code, _ in results.values()] == [0, 0], results
    assert "do not agree" not in results["node0"][1]


@pytest.mark.usefixtures("served_agent_stores")
def test_a_stopping_signal_while_waiting_for_the_rendezvous_starts_nothing(tmp_path: Path) -> None:
    """By arrival, the launcher waits for HEAD's store before it has a plan: SIGTERM there exits
    143, says so, and starts no worker."""
    cmd = ours(*c10d_line(29400, 2, 1), "--no-python", "--", *FAKE, "--ready-file", f"{tmp_path}/ready-{{rank}}")
    cmd[cmd.index("127.0.0.1:29400")] = "10.255.255.1:29400"  # nobody there: the store client keeps trying
    proc = popen(cmd)
    try:
        seen = read_until(proc, "waiting for the first node's agent at 10.255.255.1:29400")
        proc.send_signal(signal.SIGTERM)
        [(code, text)] = collect([proc], [seen])
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 143, text
    assert "stopped by signal 15 while the nodes met; started nothing" in text and "Traceback" not in text
    assert not list(tmp_path.glob("ready-*"))


@pytest.mark.usefixtures("served_agent_stores")
@pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl not installed")
def test_plan_shows_node_rank_0s_plan_which_the_first_to_arrive_runs(tmp_path: Path) -> None:
    """`plan --json` of the c10d line without a node rank is node rank 0's plan with the
    `<arrival>` warning and MASTER_PORT `<free-port>`; the launcher that arrives first runs exactly
    it (tests/test_plan_is_run.py's check, placeholders substituted), the second runs node rank 1."""
    from test_plan_is_run import WORKER, assert_worker_ran_the_plan, launcher_env, plan_json, start_run

    env = launcher_env(tmp_path)
    args = [*c10d_line(free_port(), 2, 1), WORKER]
    plan = plan_json(args, env)
    assert plan["node_rank"] == 0 and plan["master_port"] is None
    assert any("node rank <arrival>" in w for w in plan["warnings"])
    first = start_run(args, env)
    seen = read_until(first, "node rank 0 of 2")
    second = start_run(args, env)
    results = collect([first, second], [seen, ""])
    assert [code for code, _ in results] == [0, 0], results
    [rank] = plan["ranks"]
    assert_worker_ran_the_plan(rank, env, first.pid, tmp_path / "out")
    port = json.loads((tmp_path / "out" / "rank-0-attempt-0.json").read_text())["environ"]["MASTER_PORT"]
    other = json.loads((tmp_path / "out" / "rank-1-attempt-0.json").read_text())["environ"]
    assert rank["env"]["MASTER_PORT"] == "<free-port>" and port.isdigit()
    assert (other["RANK"], other["GROUP_RANK"], other["MASTER_PORT"]) == ("1", "1", port)


@pytest.mark.usefixtures("served_agent_stores")
def test_a_launcher_of_another_rdzv_id_is_refused_before_it_takes_a_rank(
    tmp_path: Path, reaped: list[subprocess.Popen[str]]
) -> None:
    """Issue 32 item 2: another job's launcher at the same endpoint took a rank by arrival (and the
    fingerprints then refused every node); it is refused at once, and the job's own second node
    takes rank 1."""
    port = free_port()
    worker = [*FAKE, "--ready-file", f"{tmp_path}/ready-{{rank}}"]
    line = c10d_line(port, 2, 1, ["--telemetry", "off", "--keepalive-s", "2", "--rdzv-id", "mine"])
    reaped.append(popen(ours(*line, "--no-python", "--", *worker)))
    wait_for(lambda: listening(port), "the first launcher never hosted the rendezvous", poll_s=0.05)
    other = [("theirs" if arg == "mine" else arg) for arg in line]
    stray = run_to_end(ours(*other, "--no-python", "--", *FAKE, "--ready-file", f"{tmp_path}/stray-{{rank}}"))
    assert stray.returncode == 2, stray.stderr
    assert "--rdzv-id theirs, but the job at" in stray.stderr and "another job's rendezvous" in stray.stderr
    assert "Traceback" not in stray.stderr and not list(tmp_path.glob("stray-*"))
    reaped.append(popen(ours(*line, "--no-python", "--", *worker)))
    results = collect(reaped, ["", ""])
    assert [code for code, _ in results] == [0, 0], results
    assert sorted(p.name for p in tmp_path.glob("ready-*")) == ["ready-0", "ready-1"]
