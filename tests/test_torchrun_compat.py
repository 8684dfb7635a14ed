"""torchrun's command line, flag by flag, under both launchers (torch is installed): the same
workers with the same rank variables and the same exit code; refused values exit 2 with nothing
started; the docs table is the flag table."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from openclaw_launch.cli.torchrun_compat import FLAGS, compat_table_markdown

torch_run = pytest.importorskip("torch.distributed.run")

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "tests" / "compat_worker.py")
TIMEOUT_S = 60
# Compared between the launchers. Not compared, by design (docs/torchrun-compat.md): ids, ports and
# paths (TORCHELASTIC_RUN_ID, TORCHELASTIC_ERROR_FILE, MASTER_PORT), TORCHELASTIC_USE_AGENT_STORE
# (no agent store here: the workers' store is made by rank 0, as without an agent) and the default
# TORCHELASTIC_SIGNALS_TO_HANDLE (we also forward Slurm's SIGUSR1/SIGUSR2); MASTER_ADDR must reach
# this host under both.
COMPARED = (
    "RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK ROLE_NAME "
    "ROLE_WORLD_SIZE TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS argv".split()
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launcher_cmd(which: str) -> list[str]:
    if which == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run"]
    return [sys.executable, "-m", "openclaw_launch"]


def env_for(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    return {**env, **extra}


def run_one(which: str, args: list[str], env: dict[str, str], out: Path) -> tuple[int, dict[int, dict[str, str]]]:
    """Run a launcher on the dumping worker; its exit code and every rank's variables."""
    out.mkdir(parents=True, exist_ok=True)
    argv = [a.replace("{dump}", str(out)) for a in args]
    proc = subprocess.run(
        [*launcher_cmd(which), *argv], env=env_for(env), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    ranks = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in out.glob("rank-*.json")}
    assert ranks or proc.returncode != 0, f"{which} {argv}: no worker ran\n{proc.stderr[-3000:]}"
    return proc.returncode, ranks


def local_address(addr: str) -> bool:
    """MASTER_ADDR reaches this host (what a worker's init_process_group needs on one node)."""
    with socket.socket() as s:
        s.bind((socket.gethostbyname(addr), 0))  # binds only if the address is this host's
    return True


def assert_same(case: str, theirs: tuple[int, dict[int, dict[str, str]]], ours: tuple[int, dict[int, dict[str, str]]]):
    (t_code, t_ranks), (o_code, o_ranks) = theirs, ours
    assert o_code == t_code, f"{case}: exit code {o_code}, torchrun {t_code}"
    assert sorted(o_ranks) == sorted(t_ranks), f"{case}: ranks {sorted(o_ranks)}, torchrun {sorted(t_ranks)}"
    for rank, t_env in t_ranks.items():
        o_env = o_ranks[rank]
        diff = {k: (o_env.get(k), t_env.get(k)) for k in COMPARED if o_env.get(k) != t_env.get(k)}
        assert not diff, f"{case} rank {rank}: (ours, torchrun) {diff}"
        if "TORCHELASTIC_SIGNALS_TO_HANDLE" in t_env and "signals" in case:
            assert o_env["TORCHELASTIC_SIGNALS_TO_HANDLE"] == t_env["TORCHELASTIC_SIGNALS_TO_HANDLE"]
        assert local_address(o_env["MASTER_ADDR"]) and local_address(t_env["MASTER_ADDR"])
        assert len({r["MASTER_PORT"] for r in o_ranks.values()}) == 1


def dump(*args: str) -> list[str]:
    return [WORKER, "--dump", "{dump}", *args]


# id -> (launcher arguments, environment). Each runs under torchrun and under openclaw-launch.
CASES: dict[str, tuple[list[str], dict[str, str]]] = {
    # pytorch/examples distributed/ddp/run_example.sh
    "ddp_run_example": (
        ["--nnodes=1", "--nproc_per_node=2", "--rdzv_id=101", "--rdzv_endpoint=localhost:{port}", *dump("a", "--lr")],
        {},
    ),
    # nanoGPT / minGPT-ddp
    "standalone": (["--standalone", "--nproc_per_node=2", *dump()], {}),
    "dash_spellings_and_restarts": (["--nproc-per-node", "2", "--max-restarts", "2", "--role", "trainer", *dump()], {}),
    "underscore_spellings": (["--nproc_per_node", "2", "--max_restarts=1", "--master_addr", "127.0.0.1", *dump()], {}),
    "pet_variables": (
        dump(),
        {"PET_NPROC_PER_NODE": "2", "PET_MAX_RESTARTS": "3", "PET_ROLE": "trainer", "PET_STANDALONE": "1"},
    ),
    "nproc_cpu_and_auto": (["--nproc-per-node", "cpu", *dump()], {}),
    "nproc_auto": (["--nproc-per-node=auto", *dump()], {}),
    "virtual_local_rank": (["--nproc-per-node=2", "--virtual-local-rank", *dump()], {}),
    "master_port_static": (["--nproc-per-node=2", "--master-port={port}", "--rdzv-backend=static", *dump()], {}),
    "logs_and_console_filters": (
        [
            "--nproc-per-node=2",
            "--log-dir",
            "{dump}/logs",
            "-r",
            "1",
            "-t",
            "0:2",
            "--local-ranks-filter",
            "0",
            *dump(),
        ],
        {},
    ),
    "accepted_without_effect_and_signals": (
        [
            "--monitor-interval=0.5",
            "--start-method",
            "fork",
            "--rdzv-conf",
            "join_timeout=60",
            "--local-addr",
            "127.0.0.1",
            "--event-log-handler",
            "null",
            "--duplicate-stdout-filters=",
            "--shutdown-timeout",
            "10",
            "--signals-to-handle",
            "SIGTERM,SIGINT",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "localhost:{port}",
            *dump(),
        ],
        {},
    ),
    "module": (["--nproc-per-node=2", "-m", "compat_worker", "--dump", "{dump}"], {}),
    "no_python": (["--no_python", "--nproc-per-node=1", sys.executable, *dump()], {}),
    "run_path": (["--run-path", *dump("x")], {}),
    "pet_flags": (["--nproc-per-node=2", *dump()], {"PET_NO_PYTHON": "0", "PET_VIRTUAL_LOCAL_RANK": "1"}),
    "worker_fails": (["--nproc-per-node=2", *dump("--exit", "1")], {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_workers_and_variables_as_torchrun(tmp_path: Path, case: str) -> None:
    args, env = CASES[case]
    with ThreadPoolExecutor(2) as pool:
        jobs = {
            which: pool.submit(
                run_one, which, [a.replace("{port}", str(free_port())) for a in args], env, tmp_path / which
            )
            for which in ("torchrun", "openclaw")
        }
        theirs, ours = jobs["torchrun"].result(), jobs["openclaw"].result()
    assert_same(case, theirs, ours)


def test_two_nodes_two_launchers_per_side(tmp_path: Path) -> None:
    """--nnodes 2 --node-rank 0/1 on loopback: one world of 4 ranks under either launcher."""

    def side(which: str) -> tuple[int, dict[int, dict[str, str]]]:
        port = str(free_port())
        base = ["--nnodes", "2", "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", port]
        with ThreadPoolExecutor(2) as pool:
            nodes = [
                pool.submit(run_one, which, [*base, "--node-rank", str(k), *dump()], {}, tmp_path / which)
                for k in (0, 1)
            ]
            results = [n.result() for n in nodes]
        return max(r[0] for r in results), {k: v for r in results for k, v in r[1].items()}

    theirs, ours = side("torchrun"), side("openclaw")
    assert_same("two_nodes", theirs, ours)
    assert sorted(ours[1]) == [0, 1, 2, 3] and ours[1][3]["GROUP_RANK"] == "1"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--nnodes", "1:4"], "--nnodes"),
        (["--rdzv-backend", "etcd", "--nnodes", "2"], "--rdzv-backend"),
        (["--rdzv_backend=c10d", "--nnodes=2", "--rdzv-endpoint", "h:1"], "--node-rank"),
        (["--logs-specs", "mine"], "--logs-specs"),
        (["--numa-binding", "core-complex"], "--numa-binding"),
        (["--duplicate-stdout-filters", "loss"], "--duplicate-stdout-filters"),
        (["--event-log-handler", "console"], "--event-log-handler"),
        (["--nproc-per-node", "xpu"], "--nproc-per-node"),
        (["--standalone", "--nnodes", "2"], "--standalone"),
        (["--signals-to-handle", "SIGKILL"], "--signals-to-handle"),
        (["--redirects", "7"], "--redirects"),
        (["--nproc_per_node=1", "--rdzv_idd=3"], "--rdzv_id"),  # unknown option: did you mean
        (["--nproc-per-node=1", "--bogus", "--dry-run"], "--bogus"),  # --dry-run after it starts nothing
        (["--nnodes", "2", "--node-rank", "2"], "--node-rank"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_refused_before_anything_starts(tmp_path: Path, args: list[str], says: str) -> None:
    marker = tmp_path / "started"
    proc = subprocess.run(
        [*launcher_cmd("openclaw"), *args, "--no-python", "touch", str(marker)],
        env=env_for({}),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not marker.exists() and proc.stdout == ""


@pytest.mark.parametrize("command", [["vaildate"], ["paln", "--config", "x.yaml"], ["rn", "train.py"]])
def test_misspelled_command_is_not_run_as_a_script(command: list[str]) -> None:
    proc = subprocess.run(
        [*launcher_cmd("openclaw"), *command], env=env_for({}), cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "did you mean" in proc.stderr, proc.stderr


def test_plan_refuses_an_unknown_option_instead_of_putting_it_in_argv() -> None:
    proc = subprocess.run(
        [*launcher_cmd("openclaw"), "plan", "--nproc-per-node=1", "--max_restarst=1", "train.py"],
        env=env_for({}),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--max_restarts" in proc.stderr, proc.stderr


def test_every_torchrun_flag_is_in_the_table() -> None:
    parser = torch_run.get_args_parser()
    theirs = {s for action in parser._actions for s in action.option_strings} - {"-h", "--help"}
    ours = {name for flag in FLAGS for name in flag.torchrun}
    assert theirs == ours


def test_docs_table_is_the_flag_table() -> None:
    doc = (ROOT / "docs" / "torchrun-compat.md").read_text()
    assert compat_table_markdown() in doc, "regenerate the table: python -m openclaw_launch.cli.torchrun_compat"
