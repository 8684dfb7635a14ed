"""torchrun's command line, flag by flag, under both launchers (torch is installed): the same
workers with the same rank variables, arguments and exit code (port 0, ``--`` after the target
included; torchrun's side from its recording, tests/torchrun_recording.py, but for a few cases);
refused values exit 2 with nothing started; the docs tables are the flag table and the
defaults table; signal lists are read by one parser in every spelling; every default is the one in
config/defaults.py; the opt-in ``torchrun`` shim, in a scratch directory."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cli_runner import Invocation, invoke
from guards import GUARD_S, wait_for
from host import free_port, needs_torch
from torchrun_recording import SIDES, case_sides, torchrun_side

from openclaw_launch.cli.torchrun_compat import FLAGS
from openclaw_launch.config import defaults
from openclaw_launch.config.signals import forwardable_names, parse_signals
from tools import option_docs
from tools.markdown_tables import marked_tables

pytestmark = needs_torch  # torchrun is torch's

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "tests" / "compat_worker.py")
# Compared between the launchers. Not compared, by design (docs/torchrun-compat.md): ids, ports and
# paths (TORCHELASTIC_RUN_ID, TORCHELASTIC_ERROR_FILE, MASTER_PORT) and the default
# TORCHELASTIC_SIGNALS_TO_HANDLE (we also forward Slurm's SIGUSR1/SIGUSR2); MASTER_ADDR must reach
# this host under both. CUDA_VISIBLE_DEVICES is compared: on a CPU host both leave a user's alone.
COMPARED = (
    "RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK ROLE_NAME "
    "ROLE_WORLD_SIZE TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS TORCHELASTIC_USE_AGENT_STORE "
    "CUDA_VISIBLE_DEVICES argv sys_argv".split()
)


def launcher_cmd(which: str) -> list[str]:
    if which == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run"]
    return [sys.executable, "-m", "openclaw_launch"]


def env_for(extra: dict[str, str]) -> dict[str, str]:
    """The launchers' environment: this one's less torchrun's settings (``PET_*``) and the GPUs a
    shell may have chosen (a case that wants them sets them), so that it is the recording's too."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_") and k != "CUDA_VISIBLE_DEVICES"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    return {**env, **extra}


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclasses.dataclass(frozen=True)
class Run:
    """A launcher's run on the dumping worker: its exit code, every rank's variables as the worker
    dumped them, the port its line was given (None: none) and its output directory."""

    code: int
    ranks: dict[int, dict[str, str]]
    port: int | None
    out: Path

    def observed(self) -> dict[str, Any]:
        """What the comparisons read of the run, as JSON, the same for every run of its line: this
        run's port, output directory, host name and drawn run id as ``{port}``, ``{dump}``,
        ``{hostname}`` and ``{drawn}`` (a port the launcher chose: ``{free port}``), the error
        file's path left out; ``files``: what else the launcher wrote in the output directory."""
        ranks = {
            str(rank): {k: self._placeholder(k, v) for k, v in env.items() if k != "TORCHELASTIC_ERROR_FILE"}
            for rank, env in sorted(self.ranks.items())
        }
        files = sorted(p.name for p in self.out.iterdir() if not p.name.startswith("rank-"))
        return {"exit_code": self.code, "ranks": ranks, "files": files}

    def _placeholder(self, key: str, value: str) -> str:
        value = value.replace(str(self.out), "{dump}")
        if self.port is not None and value == str(self.port):
            return "{port}"
        if key == "MASTER_PORT" and value != "0":
            return "{free port}"
        if key == "MASTER_ADDR" and value == socket.gethostname():
            return "{hostname}"
        if key == "TORCHELASTIC_RUN_ID" and UUID.fullmatch(value):
            return "{drawn}"
        return value


def run_one(
    which: str, args: Sequence[str], env: dict[str, str], out: Path, cwd: Path = ROOT, port: int | None = None
) -> Run:
    """Run a launcher on the dumping worker, ``{port}`` in its line and variables a free port (or
    ``port``), ``{dump}`` its output directory ``out``. Every rank got the one MASTER_PORT and a
    MASTER_ADDR that reaches this host (what a worker's init_process_group needs on one node)."""
    out.mkdir(parents=True, exist_ok=True)
    given = port or free_port()

    def fill(text: str) -> str:
        return text.replace("{port}", str(given)).replace("{dump}", str(out))

    argv, variables = [fill(a) for a in args], {k: fill(v) for k, v in env.items()}
    proc = subprocess.run(
        [*launcher_cmd(which), *argv], env=env_for(variables), cwd=cwd, capture_output=True, text=True, timeout=GUARD_S
    )
    ranks = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in out.glob("rank-*.json")}
    assert ranks or proc.returncode != 0, f"{which} {argv}: no worker ran\n{proc.stderr[-3000:]}"
    assert len({r["MASTER_PORT"] for r in ranks.values()}) <= 1, f"{which} {argv}: {ranks}"
    assert all(local_address(r["MASTER_ADDR"]) for r in ranks.values())
    uses_port = any("{port}" in text for text in [*args, *env.values()])
    return Run(proc.returncode, ranks, given if uses_port else None, out)


def compared(
    key: str,
    side: str,
    args: Sequence[str],
    env: dict[str, str],
    tmp_path: Path,
    cwd: Path = ROOT,
    ours_first: Sequence[str] = (),
) -> tuple[dict[str, Any], Run]:
    """torchrun's observed run of the line (its ``side``: the recording's ``key``, or torchrun
    itself; tests/torchrun_recording.py) and our run of it (``ours_first`` before it), at once."""

    def theirs() -> dict[str, Any]:
        return run_one("torchrun", args, env, tmp_path / "torchrun", cwd).observed()

    with ThreadPoolExecutor(2) as pool:
        recorded = pool.submit(torchrun_side, key, side, theirs)
        ours = pool.submit(run_one, "openclaw", [*ours_first, *args], env, tmp_path / "openclaw", cwd)
        return recorded.result(), ours.result()


def local_address(addr: str) -> bool:
    """MASTER_ADDR reaches this host (what a worker's init_process_group needs on one node)."""
    with socket.socket() as s:
        s.bind((socket.gethostbyname(addr), 0))  # binds only if the address is this host's
    return True


def assert_same(case: str, theirs: dict[str, Any], ours: dict[str, Any]) -> None:
    """The same exit code, ranks and rank variables (COMPARED) in torchrun's and our ``Run.observed()``."""
    (t_code, t_ranks), (o_code, o_ranks) = (theirs["exit_code"], theirs["ranks"]), (ours["exit_code"], ours["ranks"])
    assert o_code == t_code, f"{case}: exit code {o_code}, torchrun {t_code}"
    assert sorted(o_ranks) == sorted(t_ranks), f"{case}: ranks {sorted(o_ranks)}, torchrun {sorted(t_ranks)}"
    for rank, t_env in t_ranks.items():
        o_env = o_ranks[rank]
        # --virtual-local-rank: torchrun numbers even a CPU host's devices (0, 1, ...); ours has none to give
        compared = [k for k in COMPARED if k != "CUDA_VISIBLE_DEVICES" or "virtual" not in case.lower()]
        diff = {k: (o_env.get(k), t_env.get(k)) for k in compared if o_env.get(k) != t_env.get(k)}
        assert not diff, f"{case} rank {rank}: (ours, torchrun) {diff}"
        if "TORCHELASTIC_SIGNALS_TO_HANDLE" in t_env and "signals" in case:
            assert o_env["TORCHELASTIC_SIGNALS_TO_HANDLE"] == t_env["TORCHELASTIC_SIGNALS_TO_HANDLE"]


def dump(*args: str) -> list[str]:
    return [WORKER, "--dump", "{dump}", *args]


# id -> (launcher arguments, environment; "{port}": a free port, "{dump}": the output directory).
# Each runs under openclaw-launch and under torchrun (its recording, or torchrun itself).
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
    "pet_flags_virtual": (["--nproc-per-node=2", *dump()], {"PET_NO_PYTHON": "0", "PET_VIRTUAL_LOCAL_RANK": "1"}),
    "worker_fails": (["--nproc-per-node=2", *dump("--exit", "1")], {}),
    # port 0: a free port (nanoGPT-style --standalone with a port; torchtitan's run_train.sh, verbatim
    # but for the module and its config)
    "standalone_master_port_0": (["--standalone", "--nproc_per_node=2", "--master_port=0", *dump()], {}),
    "torchtitan_run_train": (
        [
            "--nproc_per_node=2",
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint=localhost:0",
            "--local-ranks-filter",
            "0",
            "--role",
            "rank",
            "--tee",
            "3",
            "-m",
            "compat_worker",
            "--dump",
            "{dump}",
            "--job.config_file",
            "debug_model.toml",
        ],
        {},
    ),
    # "--" directly after the target is argparse's end of options: dropped; a later one is the script's
    "dashdash_after_script": (["--nproc-per-node=2", WORKER, "--", "--dump", "{dump}", "--lr", "1"], {}),
    "dashdash_after_module": (["--nproc-per-node=1", "-m", "compat_worker", "--", "--dump", "{dump}", "x"], {}),
    "dashdash_later_is_kept": (["--nproc-per-node=1", *dump("a", "--", "b")], {}),
    # argparse's abbreviations (a prefix beginning one option string only; --stand is torchrun's
    # --standalone, not our --standby); after the script, --nnode is the script's
    "abbreviated_long_options": (["--nnode=1", "--nproc_per=2", "--stand", "--max_=0", *dump("--nnode", "3")], {}),
    # a CPU host: the user's CUDA_VISIBLE_DEVICES reaches the workers unchanged
    "cpu_host_keeps_cuda_visible_devices": (["--nproc-per-node=2", *dump()], {"CUDA_VISIBLE_DEVICES": "3,5"}),
}
PORT_ZERO = ("standalone_master_port_0", "torchtitan_run_train")
# Against torchrun itself in every run: the classic c10d line, and the two whose answer is this
# host's CPU count, which a recording made on another host would not know
LIVE_EVERY_RUN = ("ddp_run_example", "nproc_auto", "nproc_cpu_and_auto")


@pytest.mark.parametrize(("case", "side"), case_sides(CASES, LIVE_EVERY_RUN))
def test_same_workers_and_variables_as_torchrun(tmp_path: Path, case: str, side: str) -> None:
    theirs, ours = compared(f"compat/{case}", side, *CASES[case], tmp_path)
    assert_same(case, theirs, ours.observed())
    if case in PORT_ZERO:  # a real port under both, the same for every rank
        ports = {r["MASTER_PORT"] for r in [*theirs["ranks"].values(), *ours.observed()["ranks"].values()]}
        assert ports == {"{free port}"}
    if case == "cpu_host_keeps_cuda_visible_devices":
        assert {r.get("CUDA_VISIBLE_DEVICES") for r in ours.ranks.values()} == {"3,5"}
    if case.startswith("dashdash"):
        assert all("--" not in json.loads(r["sys_argv"])[:1] for r in ours.ranks.values())


def test_two_nodes_two_launchers_per_side(tmp_path: Path) -> None:
    """--nnodes 2 --node-rank 0/1 on loopback: one world of 4 ranks under either launcher (under
    torchrun itself in every run)."""

    def side(which: str) -> dict[str, Any]:
        port = free_port()
        base = ["--nnodes", "2", "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", "{port}"]
        with ThreadPoolExecutor(2) as pool:
            nodes = [
                pool.submit(run_one, which, [*base, "--node-rank", str(k), *dump()], {}, tmp_path / which, port=port)
                for k in (0, 1)
            ]
            runs = [n.result() for n in nodes]
        return {
            "exit_code": max(r.code for r in runs),
            "ranks": {k: v for r in runs for k, v in r.observed()["ranks"].items()},
        }

    theirs, ours = side("torchrun"), side("openclaw")
    assert_same("two_nodes", theirs, ours)
    assert sorted(ours["ranks"]) == ["0", "1", "2", "3"] and ours["ranks"]["3"]["GROUP_RANK"] == "1"


@pytest.mark.parametrize("side", SIDES)
def test_static_master_port_0_is_a_free_port_where_torchrun_hands_out_0(tmp_path: Path, side: str) -> None:
    """torchrun's static rendezvous gives the workers MASTER_PORT=0 (their init_process_group then
    waits for ever: measured); here port 0 means a free port, as torchrun's c10d and --standalone
    read it, and the report holds it."""
    report = tmp_path / "run.json"
    line = ["--nproc-per-node=2", "--master-port=0", *dump()]
    theirs, ours = compared(
        "compat/static_master_port_0", side, line, {}, tmp_path, ours_first=["--report", str(report)]
    )
    assert_same("static_port_0", theirs, ours.observed())
    ports = {r["MASTER_PORT"] for r in ours.ranks.values()}
    assert {r["MASTER_PORT"] for r in theirs["ranks"].values()} == {"0"} and ports != {"0"}
    assert ports == {str(json.loads(report.read_text())["master_port"])}


DOUBLE_DASH_SHAPES = {
    "nanochat_module": ["-m", "scripts.base_train", "--", "--depth=24", "--device_batch_size=2"],  # nanochat's line
    "no_python_command": ["{tmp}/worker.sh", "--", "--depth=24"],  # --no-python cmd -- args
}


@pytest.mark.parametrize(("shape", "side"), case_sides(DOUBLE_DASH_SHAPES))
def test_double_dash_after_the_target_under_both(tmp_path: Path, shape: str, side: str) -> None:
    """The worker parses its arguments strictly (argparse's parse_args, as nanochat's base_train):
    a '--' left in sys.argv fails every rank with 'unrecognized arguments'."""
    package = tmp_path / "scripts"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "base_train.py").write_text(
        "import argparse, sys\nimport compat_worker\n"
        "p = argparse.ArgumentParser()\n"
        "p.add_argument('--depth', type=int, required=True)\np.add_argument('--device_batch_size', type=int)\n"
        "p.add_argument('--dump', required=True)\np.parse_args()\nsys.exit(compat_worker.main())\n"
    )
    wrapper = tmp_path / "worker.sh"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m scripts.base_train "$@"\n')
    wrapper.chmod(0o755)
    target = [a.replace("{tmp}", str(tmp_path)) for a in DOUBLE_DASH_SHAPES[shape]]
    no_python = ["--no-python"] if target[0].endswith(".sh") else []
    args = [*no_python, "--nproc-per-node=2", *target, "--dump", "{dump}"]
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), str(ROOT / "tests")])}
    theirs, ours = compared(f"compat/double_dash_{shape}", side, args, env, tmp_path, cwd=tmp_path)
    assert_same("double_dash", theirs, ours.observed())
    assert ours.code == 0
    for rank in ours.ranks.values():
        assert json.loads(rank["sys_argv"])[:1] == ["--depth=24"]


def test_a_free_port_is_held_until_the_launcher_exits() -> None:
    """No other launcher's free port can be the same one while this launcher runs (the kernel gives
    a bound port to no bind(0)); rank 0's store still listens on it (SO_REUSEADDR, as torch's)."""
    from torch.distributed import TCPStore

    from openclaw_launch.plan.context import free_port as launcher_free_port

    port = launcher_free_port()
    others = [socket.socket() for _ in range(500)]
    try:
        for other in others:
            other.bind(("", 0))
            assert other.getsockname()[1] != port
    finally:
        for other in others:
            other.close()
    store = TCPStore("127.0.0.1", port, 1, is_master=True, wait_for_workers=False)
    store.set("k", "v")
    assert store.get("k") == b"v"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--nnodes", "1:4"], "--nnodes"),
        (["--rdzv-backend", "etcd", "--nnodes", "2"], "--rdzv-backend"),
        (["--rdzv_backend=c10d", "--nnodes=2"], "--rdzv-endpoint"),  # by arrival: where the nodes meet
        (["--rdzv_backend=c10d", "--nnodes=2", "--rdzv-endpoint", "h:0"], "port 0 is for one node"),
        (["--rdzv_backend=c10d", "--nnodes=2", "--rdzv-endpoint", "h:9", "--agent-port", "7"], "--agent-port"),
        (["--logs-specs", "mine"], "--logs-specs"),
        (["--numa-binding", "core-complex"], "--numa-binding"),
        (["--duplicate-stdout-filters", "loss"], "--duplicate-stdout-filters"),
        (["--event-log-handler", "console"], "--event-log-handler"),
        (["--nproc-per-node", "xpu"], "--nproc-per-node"),
        (["--standalone", "--nnodes", "2"], "--standalone"),
        (["--signals-to-handle", "SIGKILL"], "--signals-to-handle"),
        (["--signals-to-handle", "SIGTERM,usr9"], "SIGUSR1"),  # the message lists the valid names
        (["--forward-signals", "stop"], "--forward-signals"),
        (["--redirects", "7"], "--redirects"),
        (["--nproc_per_node=1", "--rdzv_idd=3"], "--rdzv_id"),  # unknown option: did you mean
        # a prefix of two spellings is ambiguous, as under torchrun's argparse
        (["--nproc=1"], "ambiguous option: --nproc could match --nproc-per-node, --nproc_per_node"),
        (["--nproc-per-node=1", "--monitor", "1"], "--monitor could match --monitor-interval, --monitor_interval"),
        (["--nproc-per-node=1", "--bogus", "--dry-run"], "--bogus"),  # --dry-run after it starts nothing
        (["--nnodes", "2", "--node-rank", "2"], "--node-rank"),
        (["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", "0"], "MASTER_PORT 0"),
        (["--nnodes=2", "--node-rank=0", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0"], "MASTER_PORT 0"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_refused_before_anything_starts(tmp_path: Path, args: list[str], says: str) -> None:
    marker = tmp_path / "started"
    line = [*args, "--no-python", "touch", str(marker)]
    if says == "--bogus":  # through the entry point
        cmd = [*launcher_cmd("openclaw"), *line]
        proc = subprocess.run(cmd, env=env_for({}), cwd=ROOT, capture_output=True, text=True, timeout=GUARD_S)
    else:
        proc = invoke(*line, env=env_for({}))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not marker.exists() and proc.stdout == ""


@pytest.mark.parametrize("command", [["vaildate"], ["paln", "--config", "x.yaml"], ["rn", "train.py"]])
def test_misspelled_command_is_not_run_as_a_script(command: list[str]) -> None:
    proc = invoke(*command, env=env_for({}))
    assert proc.returncode == 2 and "did you mean" in proc.stderr, proc.stderr


def test_plan_refuses_an_unknown_option_instead_of_putting_it_in_argv() -> None:
    proc = invoke("plan", "--nproc-per-node=1", "--max_restarst=1", "train.py", env=env_for({}))
    assert proc.returncode == 2 and "--max_restarts" in proc.stderr, proc.stderr


def test_plan_takes_abbreviated_options_as_run_does() -> None:
    """Only before the script: its own ``--nproc`` reaches it (torchrun's argparse refuses it there)."""
    proc = invoke("plan", "--nnode=1", "--nproc_per=2", "--stand", "train.py", "--nproc", "3", env=env_for({}))
    assert proc.returncode == 0 and "world size 2" in proc.stdout, proc.stderr
    assert "train.py --nproc 3" in proc.stdout


def torchrun_parser() -> argparse.ArgumentParser:
    """torchrun's own argument parser (torch imported here, when a test asks: not at collection)."""
    from torch.distributed.run import get_args_parser

    return get_args_parser()


def test_every_torchrun_flag_is_in_the_table() -> None:
    parser = torchrun_parser()
    theirs = {s for action in parser._actions for s in action.option_strings} - {"-h", "--help"}
    ours = {name for flag in FLAGS for name in flag.torchrun}
    assert theirs == ours


def test_docs_tables_are_the_flag_and_defaults_tables() -> None:
    text = option_docs.COMPAT_FILE.read_text()
    assert option_docs.update(option_docs.COMPAT_FILE, text) == text, "regenerate: python -m tools.option_docs --write"
    assert marked_tables(text) == ["torchrun flags", "torchrun variables", "defaults"]


def test_torchrun_column_of_the_defaults_table_is_torchruns() -> None:
    parser = torchrun_parser()
    theirs = {a.dest: a.default for a in parser._actions}
    rows = {d.option.split(", ")[0]: d for d in defaults.DEFAULTS}
    assert rows["--signals-to-handle"].torchrun == theirs["signals_to_handle"]
    assert rows["--max-restarts"].torchrun == str(theirs["max_restarts"])
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import DEFAULT_PORT

    assert defaults.RDZV_PORT == DEFAULT_PORT
    assert set(parse_signals(theirs["signals_to_handle"])) <= set(defaults.HANDLED_SIGNALS)


def test_every_option_default_is_the_one_definition() -> None:
    """The click options of run and plan, and the option dataclasses, read config/defaults.py."""
    from openclaw_launch.agents.fate import AgentOptions
    from openclaw_launch.cli.main import cli
    from openclaw_launch.preflight.command import PreflightOptions
    from openclaw_launch.run.supervise import SuperviseOptions
    from openclaw_launch.stats.verdict import find_stragglers
    from openclaw_launch.stats.wiring import StatsOptions

    expected = {
        "--grace-period-s": defaults.GRACE_PERIOD_S,
        "--kill-timeout-s": defaults.KILL_TIMEOUT_S,
        "--max-restarts": defaults.MAX_RESTARTS,
        "--restart-backoff-s": defaults.RESTART_BACKOFF_S,
        "--forward-signals": ",".join(defaults.FORWARD_ONLY_SIGNALS),
        "--telemetry": defaults.TELEMETRY_MODE,
        "--stats-interval-s": defaults.STATS_INTERVAL_S,
        "--straggler-threshold-pct": defaults.STRAGGLER_THRESHOLD_PCT,
        "--agent-timeout-s": defaults.AGENT_TIMEOUT_S,
        "--keepalive-s": defaults.KEEPALIVE_S,
    }
    import click

    run_command = cli.get_command(click.Context(cli), "run")  # the commands load lazily (cli/main.py)
    assert run_command is not None
    run_params = {opt: p for p in run_command.params for opt in getattr(p, "opts", ())}
    assert {opt: run_params[opt].default for opt in expected} == expected
    documented = {d.option.split(", ")[0] for d in defaults.DEFAULTS}
    assert set(expected) <= documented
    supervise = SuperviseOptions()
    assert (supervise.grace_period_s, supervise.kill_timeout_s, supervise.max_restarts) == (
        defaults.GRACE_PERIOD_S,
        defaults.KILL_TIMEOUT_S,
        defaults.MAX_RESTARTS,
    )
    assert (supervise.restart_backoff_s, supervise.restart_backoff_max_s) == (
        defaults.RESTART_BACKOFF_S,
        defaults.RESTART_BACKOFF_MAX_S,
    )
    assert supervise.forwarded_signals == tuple(signal.Signals[n] for n in defaults.HANDLED_SIGNALS)
    assert supervise.prefix_template == defaults.CONSOLE_PREFIX
    stats = StatsOptions()
    assert (stats.interval_s, stats.threshold_pct) == (defaults.STATS_INTERVAL_S, defaults.STRAGGLER_THRESHOLD_PCT)
    agent_fields = {f.name: f.default for f in dataclasses.fields(AgentOptions)}
    assert (agent_fields["join_timeout_s"], agent_fields["keepalive_s"]) == (
        defaults.AGENT_TIMEOUT_S,
        defaults.KEEPALIVE_S,
    )
    assert PreflightOptions().grace_period_s == defaults.GRACE_PERIOD_S
    import inspect

    assert inspect.signature(find_stragglers).parameters["threshold_pct"].default == defaults.STRAGGLER_THRESHOLD_PCT


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("SIGUSR1", ("SIGUSR1",)),
        ("usr1", ("SIGUSR1",)),
        ("USR1, sigterm", ("SIGUSR1", "SIGTERM")),
        (f"{int(signal.SIGUSR2)},15", ("SIGUSR2", "SIGTERM")),
        ("SIGTERM,term,15", ("SIGTERM",)),  # each once
        ("SIGIOT", ("SIGABRT",)),  # an alias: the canonical name
    ],
)
def test_one_signal_parser_takes_every_spelling(text: str, names: tuple[str, ...]) -> None:
    assert parse_signals(text) == names


@pytest.mark.parametrize("text", ["SIGKILL", "stop", "9", "", " , ", "SIGFOO", "999", "none", "SIG_DFL"])
def test_signal_parser_refuses_what_cannot_be_forwarded(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_signals(text)
    message = str(info.value)
    assert "cannot be forwarded" in message or "at least one" in message or "SIGUSR1, SIGSEGV" in message
    assert parse_signals("none", allow_none=True) == () == parse_signals("", allow_none=True)


def test_every_catchable_name_torchrun_takes_is_taken() -> None:
    """torchrun takes exact names (getattr(signal, name)); each of those means the same here."""
    for name in forwardable_names():
        assert parse_signals(name) == (name,) and parse_signals(name.lower().removeprefix("sig")) == (name,)


def test_signal_spellings_reach_the_workers_and_the_supervisor(tmp_path: Path) -> None:
    """--signals-to-handle by number and --forward-signals in lower case, on a real launcher: the
    workers' TORCHELASTIC_SIGNALS_TO_HANDLE has the canonical names, SIGUSR2 (forward-only) reaches
    the worker and the job goes on, SIGUSR1 (handled) stops it with 128+SIGUSR1."""
    usr1 = int(signal.SIGUSR1)
    worker = str(ROOT / "tests" / "fake_worker.py")
    handled = ["--nproc-per-node", "1", "--signals-to-handle", f"{usr1},term,usr2"]
    args = [
        *handled,
        "--telemetry",
        "off",
        "--grace-period-s",
        "1",
        "--forward-signals",
        "usr2",
        worker,
        "--log-signals",
        f"{tmp_path}/sig",
    ]
    args += ["--survive-usr", "--ready-file", f"{tmp_path}/ready", "--sleep", "60"]
    plan = subprocess.run(
        [*launcher_cmd("openclaw"), "plan", "--json", *handled, worker],
        env=env_for({}),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert plan.returncode == 0, plan.stderr
    (rank,) = json.loads(plan.stdout)["ranks"]
    assert rank["env"]["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGUSR1,SIGTERM,SIGUSR2"
    proc = subprocess.Popen(
        [*launcher_cmd("openclaw"), *args], env=env_for({}), cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    try:
        ready, log = tmp_path / "ready", tmp_path / "sig"
        wait_for(lambda: ready.exists() or proc.poll() is not None, "the worker never started")
        assert ready.exists(), proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGUSR2)
        wait_for(lambda: log.exists() and "SIGUSR2" in log.read_text(), "SIGUSR2 never reached the worker")
        assert proc.poll() is None, "a forward-only signal stopped the job"
        proc.send_signal(signal.SIGUSR1)
        _, err = proc.communicate(timeout=GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + usr1, err
    assert log.read_text().split() == ["SIGUSR2", "SIGUSR1"]


def shim_command(bin_dir: Path, *args: str) -> Invocation:
    """``install-torchrun-shim`` in this process (tests/cli_runner.py): it only writes files."""
    return invoke("install-torchrun-shim", "--dir", str(bin_dir), *args, env=env_for({}))


@pytest.mark.parametrize("side", SIDES)
def test_torchrun_shim_runs_a_shell_script_that_calls_torchrun_under_openclaw(tmp_path: Path, side: str) -> None:
    """In a scratch bin directory holding a copy of torch's torchrun (the real one is never
    touched): refused without --force, replaced with it, the script's `torchrun` line then gives
    the workers torchrun's variables from openclaw-launch (through the real entry point), and
    --uninstall puts torch's back."""
    import shutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    real = shutil.which("torchrun")
    assert real is not None
    original = Path(real).read_bytes()
    (bin_dir / "torchrun").write_bytes(original)
    (bin_dir / "torchrun").chmod(0o755)

    refused = shim_command(bin_dir)
    assert refused.returncode == 2 and "--force" in refused.stderr and "Traceback" not in refused.stderr
    assert (bin_dir / "torchrun").read_bytes() == original
    installed = shim_command(bin_dir, "--force")
    assert installed.returncode == 0, installed.stderr
    assert (bin_dir / "torchrun.before-openclaw").read_bytes() == original

    script = tmp_path / "run_train.sh"
    script.write_text('#!/bin/sh\ntorchrun --nproc_per_node=2 --rdzv_backend c10d --rdzv_endpoint="localhost:0" "$@"\n')
    env = env_for({"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    out = tmp_path / "dump"
    out.mkdir()
    proc = subprocess.run(
        ["sh", str(script), WORKER, "--dump", str(out)], env=env, capture_output=True, text=True, timeout=GUARD_S
    )
    assert proc.returncode == 0, proc.stderr
    ranks = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in out.glob("rank-*.json")}
    line = ["--nproc_per_node=2", "--rdzv_backend", "c10d", "--rdzv_endpoint=localhost:0", *dump()]
    theirs = torchrun_side("compat/shim_line", side, lambda: run_one("torchrun", line, {}, tmp_path / "t").observed())
    assert_same("shim", theirs, Run(proc.returncode, ranks, None, out).observed())
    assert all("/openclaw-" in r["TORCHELASTIC_ERROR_FILE"] for r in ranks.values())  # openclaw's workers, not torch's

    again = shim_command(bin_dir)  # the shim is ours: rewritten without --force
    assert again.returncode == 0, again.stderr
    removed = shim_command(bin_dir, "--uninstall")
    assert removed.returncode == 0, removed.stderr
    assert (bin_dir / "torchrun").read_bytes() == original and not (bin_dir / "torchrun.before-openclaw").exists()
    nothing = shim_command(bin_dir, "--uninstall")
    assert nothing.returncode == 2 and "not the shim" in nothing.stderr
    assert (bin_dir / "torchrun").read_bytes() == original


def test_torchrun_shim_in_a_directory_without_torchrun(tmp_path: Path) -> None:
    assert shim_command(tmp_path).returncode == 0
    shim = tmp_path / "torchrun"
    assert os.access(shim, os.X_OK) and "-m openclaw_launch" in shim.read_text()
    removed = shim_command(tmp_path, "--uninstall")
    assert removed.returncode == 0 and not shim.exists()
    assert "nothing to undo" in shim_command(tmp_path, "--uninstall").stdout
    missing = shim_command(tmp_path / "absent")
    assert missing.returncode == 2 and "--dir" in missing.stderr
