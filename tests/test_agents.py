"""The agents' pure parts: Slurm hostlists, fingerprints and their differences, the job report's
merge (stragglers named by node and rank), and forwarded-only signals in the supervisor."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from cli_runner import invoke
from guards import GUARD_S, wait_for
from supervise_driver import make_plan

from openclaw_launch.agents.fingerprint import Differences, differences, fingerprint
from openclaw_launch.agents.hostlist import expand_hostlist, parse_hostlist
from openclaw_launch.agents.versions import nccl_version, node_versions, torch_versions
from openclaw_launch.config.model import Config, NodeSpec, Runtime
from openclaw_launch.config.reader import load_config
from openclaw_launch.errors import PlanError
from openclaw_launch.plan.build import build_plan
from openclaw_launch.plan.context import run_context
from openclaw_launch.plan.model import Entry, PlanOptions
from openclaw_launch.run.supervise import JobResult, SuperviseOptions, supervise
from openclaw_launch.topology.model import Topology
from tools import option_docs
from tools.markdown_tables import marked_tables

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("n[1-2,5]", ["n1", "n2", "n5"]),
        ("gpu-a[01-03],gpu-b7", ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-b7"]),
        ("c[08-10]", ["c08", "c09", "c10"]),  # zero padding kept across a width change
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("login", ["login"]),
        ("a,b[3],c-1", ["a", "b3", "c-1"]),
    ],
)
def test_slurm_hostlists_expand(text: str, hosts: list[str]) -> None:
    assert parse_hostlist(text) == hosts
    assert expand_hostlist(text, use_scontrol=False) == hosts


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="no scontrol on PATH")
def test_scontrol_agrees_with_the_parser() -> None:
    assert expand_hostlist("gpu-a[01-03],gpu-b7") == parse_hostlist("gpu-a[01-03],gpu-b7")


@pytest.mark.parametrize("text", ["n[1-", "n1]", "n[a-b]", "n[3-1]"])
def test_malformed_hostlists_are_errors(text: str) -> None:
    with pytest.raises(PlanError, match="malformed Slurm hostlist"):
        parse_hostlist(text)


def _config(nthreads: int | None = None) -> Config:
    nodes = (NodeSpec(name="a", ip="10.0.0.1", cpu_workers=2), NodeSpec(name="b", ip="10.0.0.2", cpu_workers=1))
    return Config(nodes=nodes, runtime=Runtime(nccl_nthreads=nthreads), source="c.yaml")


def _fp(node: str, config: Config, env: dict[str, str], versions: dict[str, str] | None = None) -> dict[str, str]:
    topo = Topology(numa_nodes={0: (0, 1, 2, 3)}, allowed_cpus=(0, 1, 2, 3), source="test:cpus")
    plan = build_plan(
        config,
        topo,
        run_context("j", "/tmp", None),
        PlanOptions(entry=Entry("script", "t.py"), node=node, base_env=env),
    )
    return fingerprint(config, plan, versions or {"torch": "2.13.0"}, env)


def test_same_job_same_fingerprint_on_every_node() -> None:
    prints = {"a": _fp("a", _config(), {}), "b": _fp("b", _config(), {})}
    assert differences(prints) == Differences(refused=(), warned=())
    assert prints["a"]["job.master"] == "10.0.0.1:29500" and prints["a"]["job.world_size"] == "3"


def test_one_nccl_variable_one_config_value_one_version_each_named_with_both_values() -> None:
    prints = {
        "a": _fp("a", _config(), {}),
        "b": _fp("b", _config(nthreads=8), {"NCCL_DEBUG": "INFO"}, {"torch": "2.12.0"}),
    }
    found = differences(prints)
    assert _but_hash(found.refused) == [
        "node b: config.runtime.nccl_nthreads = '8', node a has 'null'",
        "node b: env.NCCL_NTHREADS = '8', node a has <unset>",
        "node b: version.torch = '2.12.0', node a has '2.13.0'",
    ]
    assert found.warned == ("node b: env.NCCL_DEBUG = 'INFO', node a has <unset>",)  # a log level: WARN_ONLY


def _but_hash(lines: Sequence[str]) -> list[str]:
    """The lines without the config hash's (which differs with any config value, shown as well)."""
    hashed = [line for line in lines if ": config.sha256 = " in line]
    assert len(hashed) == 1, lines
    return [line for line in lines if line not in hashed]


def test_warn_only_keys_warn_and_every_other_difference_refuses() -> None:
    """OMP_* and debug output only warn; CUDA_*, TORCH_* behaviour and versions refuse."""
    env = {"OMP_NUM_THREADS": "4", "TORCH_SHOW_CPP_STACKTRACES": "1", "NVSHMEM_DEBUG": "INFO"}
    env |= {"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "NVSHMEM_SYMMETRIC_SIZE": "1G"}
    prints = {"a": _fp("a", _config(), {}), "b": _fp("b", _config(), env, {"torch": "2.13.0", "nccl": "2.27.3"})}
    found = differences(prints)
    assert found.warned == (
        "node b: env.NVSHMEM_DEBUG = 'INFO', node a has <unset>",
        "node b: env.OMP_NUM_THREADS = '4', node a has <unset>",
        "node b: env.TORCH_SHOW_CPP_STACKTRACES = '1', node a has <unset>",
    )
    assert found.refused == (
        "node b: env.NVSHMEM_SYMMETRIC_SIZE = '1G', node a has <unset>",
        "node b: env.TORCH_DISTRIBUTED_DEBUG = 'DETAIL', node a has <unset>",
        "node b: version.nccl = '2.27.3', node a has <unset>",
    )


def test_the_warn_only_table_in_the_docs_is_the_codes() -> None:
    text = option_docs.MULTINODE_FILE.read_text()
    fresh = option_docs.update(option_docs.MULTINODE_FILE, text)
    assert fresh == text, "regenerate: python -m tools.option_docs --write"
    assert "warn-only fingerprint keys" in marked_tables(text)


def test_the_fingerprint_holds_the_gpus_the_config_hash_and_every_version() -> None:
    fp = _fp("a", _config(), {}, node_versions(ROOT / "tests/data/hosts/h200x1", lambda: "3.11.7"))
    assert fp["version.driver"] == "580.159.04"  # the recorded host's /proc/driver/nvidia/version
    assert fp["version.python"] == "3.11.7" and fp["version.torch"].startswith("2.")  # torch not imported
    assert len(fp["config.sha256"]) == 64 and fp["gpu.count"] == "0" and fp["gpu.order"] == "-"


def test_a_variable_the_workers_inherit_from_one_launcher_is_a_difference() -> None:
    """The plan copies no CUDA_* variable, but the workers inherit the launcher's environment."""
    prints = {
        "a": _fp("a", _config(), {}),
        "b": _fp("b", _config(), {"CUDA_LAUNCH_BLOCKING": "1", "CUDA_VISIBLE_DEVICES": "3", "SLURM_NODEID": "1"}),
    }
    assert differences(prints).refused == ("node b: env.CUDA_LAUNCH_BLOCKING = '1', node a has <unset>",)


def test_where_a_config_was_read_from_is_no_difference(tmp_path: Path) -> None:
    """The same config read from two files, one with more comment and blank lines (so other YAML
    line numbers) and another name: they agree; a changed value still differs."""
    text = (ROOT / "configs" / "two-nodes-loopback.yaml").read_text()
    plain, commented, changed = tmp_path / "a.yaml", tmp_path / "b.yaml", tmp_path / "c.yaml"
    plain.write_text(text)
    commented.write_text("# a comment\n\n" + text.replace("    - name: node1", "    # node one\n    - name: node1"))
    changed.write_text(text.replace("cpu_workers: 1", "cpu_workers: 2"))
    configs = {path.name: load_config(str(path)) for path in (plain, commented, changed)}
    assert configs["a.yaml"].nodes[1].line != configs["b.yaml"].nodes[1].line  # the lines differ indeed
    prints = {name: _fp("node0", config, {}) for name, config in configs.items()}
    assert differences({"a": prints["a.yaml"], "b": prints["b.yaml"]}) == Differences(refused=(), warned=())
    assert _but_hash(differences({"a": prints["a.yaml"], "c": prints["c.yaml"]}).refused) == [
        "node c: config.nodes[1].cpu_workers = '2', node a has '1'",
        "node c: env.WORLD_SIZE = '4', node a has '3'",
        "node c: job.world_size = '4', node a has '3'",
    ]


def test_supervisor_forwards_usr1_without_stopping_and_stops_on_term(tmp_path: Path) -> None:

    log, ready = tmp_path / "sig-{rank}", tmp_path / "ready-{rank}"
    worker = ["--log-signals", str(log), "--survive-usr", "--ready-file", str(ready), "--sleep", "2"]
    plan = make_plan(2, worker)
    opts = SuperviseOptions(pass_signals=(signal.SIGUSR1, signal.SIGUSR2), use_guardian=False, grace_period_s=2)

    def poke() -> None:
        wait_for(lambda: all((tmp_path / f"ready-{r}").exists() for r in range(2)), "workers never got ready")
        os.kill(os.getpid(), signal.SIGUSR1)

    threading.Thread(target=poke, daemon=True).start()
    result: JobResult = supervise(plan, opts)
    assert result.exit_code == 0 and result.signal_received is None  # the job went on to its end
    assert [(tmp_path / f"sig-{r}").read_text() for r in range(2)] == ["SIGUSR1\n", "SIGUSR1\n"]


def test_forward_signals_option_is_checked() -> None:
    out = invoke("--forward-signals", "SIGKILL", "--dry-run", "t.py")
    assert out.returncode == 2 and "--forward-signals" in out.stderr


def test_a_one_node_run_never_imports_torch() -> None:
    """The agents (and torch's TCPStore) are for several nodes only: one node starts without torch."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "openclaw_launch", "--nproc-per-node", "1", "--telemetry", "off"]
        + ["--no-python", "--", "true"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=GUARD_S,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "openclaw_launch.run.supervise" in imported and not {m for m in imported if m.split(".")[0] == "torch"}


def test_the_store_host_is_the_endpoints_machine_by_torchruns_rule() -> None:
    """c10d's ``_matches_machine_hostname``: localhost, loopback, this host's name or an address of
    one of its interfaces host the agents' store; another machine's address does not."""
    import socket

    from openclaw_launch.agents.identity import local_identity
    from openclaw_launch.agents.store import is_this_host

    ours = [a for a in local_identity()[1] if not a.startswith(("127.", "::1", "fe80"))]
    for addr in ["localhost", "127.0.0.1", "127.0.1.1", "::1", socket.gethostname(), *ours[:1]]:
        assert is_this_host(addr), addr
    assert not is_this_host("192.0.2.1")  # TEST-NET-1: never an address of this host


def test_versions_are_read_from_the_files_never_by_importing_torch(tmp_path: Path) -> None:
    """A CUDA build's torch/version.py text and a bundled libnccl name; in a fresh interpreter,
    reading every version leaves torch unimported."""
    torch_dir = tmp_path / "torch"
    (torch_dir / "lib").mkdir(parents=True)
    (torch_dir / "version.py").write_text(
        "from typing import Optional\n__version__ = '2.8.0+cu128'\ndebug = False\ncuda: Optional[str] = '12.8'\n"
    )
    (torch_dir / "lib" / "libnccl.so.2.26.2").write_text("")
    assert torch_versions(torch_dir) == {"torch": "2.8.0+cu128", "torch_cuda": "12.8"}
    assert nccl_version(torch_dir) == "2.26.2" and torch_versions(tmp_path / "none") == {
        "torch": "<unset>",
        "torch_cuda": "<unset>",
    }
    code = (
        "import sys; from pathlib import Path; from openclaw_launch.agents.versions import node_versions; "
        "v = node_versions(Path('/'), lambda: 'x'); print(v['torch'] != '<unset>', 'torch' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=GUARD_S, env=env)
    assert out.stdout.split() == ["True", "False"], out.stderr
