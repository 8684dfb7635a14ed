"""The preflight that decides: the node-pair rounds, the Slurm hostlist of the exclude list, the
GEMM and pair verdicts (pure), and real CPU preflights on loopback nodes, one of them slowed by the
test-only hook (named, excluded, exit 4, the exclude file), with the bad inputs refused first."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_runner import invoke
from guards import GUARD_S

from openclaw_launch.agents.hostlist import compress_hostlist, parse_hostlist
from openclaw_launch.codec import to_json
from openclaw_launch.preflight.decide import EXCLUDED_SOME, Floors, decide, exit_code
from openclaw_launch.preflight.measure import SLOWDOWN_VAR
from openclaw_launch.preflight.record import decision_floors, record, recorded_floors
from openclaw_launch.preflight.rounds import round_robin

ROOT = Path(__file__).resolve().parent.parent
NO_FLOORS = Floors({}, {})


@pytest.mark.parametrize("n", range(2, 10))
def test_rounds_meet_every_pair_once_disjoint_per_round(n: int) -> None:
    rounds = round_robin(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == list(itertools.combinations(range(n), 2))  # every pair, once
    for r in rounds:
        members = [node for pair in r for node in pair]
        assert len(members) == len(set(members))  # no node twice in a round
        assert len(r) == n // 2  # as many pairs as fit: one node sits out when n is odd
    assert round_robin(1) == [] and round_robin(0) == []


@pytest.mark.parametrize(
    "hosts,text",
    [
        (["node01", "node02", "node03", "node07"], "node[01-03,07]"),
        (["node9", "node11", "node10"], "node[9-11]"),
        (["n08", "n10", "n09", "login"], "login,n[08-10]"),
        (["gpu-b7", "gpu-a02", "gpu-a01", "gpu-a01"], "gpu-a[01-02],gpu-b7"),
        (["a1"], "a1"),
        ([], ""),
    ],
)
def test_compressed_hostlist_expands_back(hosts: list[str], text: str) -> None:
    assert compress_hostlist(hosts) == text
    assert sorted(parse_hostlist(text)) == sorted(set(hosts))


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="needs Slurm's scontrol")
def test_compressed_hostlist_is_slurms_own(tmp_path: Path) -> None:
    """The same text as `scontrol show hostlistsorted` (a local operation; it wants a slurm.conf)."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nNodeName=localhost\nPartitionName=p Nodes=localhost\n")
    for hosts in (["node07", "node01", "node03", "node02"], ["n10", "n08", "login", "n09"], ["x9", "x11", "x10"]):
        slurm = subprocess.run(
            ["scontrol", "show", "hostlistsorted", ",".join(hosts)],
            env={**os.environ, "SLURM_CONF": str(conf)},
            capture_output=True,
            text=True,
            timeout=GUARD_S,
        )
        assert slurm.returncode == 0, slurm.stderr
        assert compress_hostlist(hosts) == slurm.stdout.strip()


def _world(
    tflops: dict[str, list[float]], pair_s: dict[tuple[str, str], float], correct: bool = True
) -> list[dict[str, Any]]:
    """Every rank's gathered entry: ``tflops`` per node (one GPU each), pair seconds by node names."""
    world, rank = [], 0
    for k, (node, gpus) in enumerate(tflops.items()):
        for local, t in enumerate(gpus):
            gemm = {"tflops": t, "device": "H200", "dtype": "bfloat16", "n": 8192, "gpu_index": local}
            gemm["gpu_uuid"] = f"GPU-{node}-{local}"
            pairs = {
                f"pair:{a},{b}": {"seconds": s, "correct": correct} for (a, b), s in pair_s.items() if node in (a, b)
            }
            world.append({"rank": rank, "local_rank": local, "node": node, "node_rank": k, "host": node, "gemm": gemm})
            world[-1]["pairs"] = pairs
            rank += 1
    return world


def test_a_slow_gpu_in_a_good_node_and_a_slow_node_are_excluded() -> None:
    fast = [700.0] * 8
    nodes = {"a01": fast, "a02": [*fast[:7], 600.0], "a03": [440.0] * 8, "a04": fast}
    world = _world(nodes, {pair: 0.01 for pair in itertools.combinations(nodes, 2)})
    d = decide(world, 1 << 30, 20, 10.0, NO_FLOORS)
    slow = [(g.node, g.gpu) for g in d.gemm if g.status == "slow"]
    assert slow == [("a02", 7)] + [("a03", i) for i in range(8)]
    assert "14 % below its node's median" in next(g.message for g in d.gemm if g.node == "a02" and g.gpu == 7)
    assert d.exclude_hostlist == "a[02-03]" and [x.node for x in d.excluded] == ["a02", "a03"]
    assert exit_code(False, d) == EXCLUDED_SOME and exit_code(True, d) == 1


def test_pairs_name_the_node_whose_every_pair_is_slow() -> None:
    nodes = {f"n{k}": [1.0] for k in range(4)}
    seconds = {(f"n{a}", f"n{b}"): (0.004 if 2 in (a, b) else 0.001) for a, b in itertools.combinations(range(4), 2)}
    d = decide(_world(nodes, seconds), 1 << 20, 5, 50.0, NO_FLOORS)
    assert d.rounds == 3 and len(d.pairs) == 6
    assert {p.name for p in d.pairs if p.status == "slow"} == {"pair:n0,n2", "pair:n1,n2", "pair:n2,n3"}
    assert d.exclude_hostlist == "n2" and d.unexplained == () and exit_code(False, d) == EXCLUDED_SOME
    assert "all 3 of its pairs" in d.excluded[0].reasons[0]


def test_two_nodes_cannot_tell_which_end_and_a_slow_fabric_excludes_nobody() -> None:
    two = decide(_world({"a": [1.0], "b": [1.0]}, {("a", "b"): 0.01}), 1 << 20, 5, 10.0, Floors({}, {"pair:a,b": 1.0}))
    assert [p.status for p in two.pairs] == ["slow"] and "--expect floor" in two.pairs[0].message
    assert two.excluded == () and two.unexplained and exit_code(False, two) == 1
    wrong = decide(_world({"a": [1.0], "b": [1.0]}, {("a", "b"): 0.01}, correct=False), 1 << 20, 5, 10.0, NO_FLOORS)
    assert wrong.pairs[0].status == "fail" and exit_code(False, wrong) == 1
    everyone = {(a, b): 0.01 for a, b in itertools.combinations("pqr", 2)}
    floors = Floors({}, {f"pair:{a},{b}": 1.0 for a, b in everyone})
    slow_all = decide(_world({n: [1.0] for n in "pqr"}, everyone), 1 << 20, 5, 10.0, floors)
    assert all(p.status == "slow" for p in slow_all.pairs)  # every pair under its floor: the fabric,
    assert slow_all.excluded == () and exit_code(False, slow_all) == 1  # no node to blame
    missing = _world({"a": [1.0], "b": [1.0]}, {("a", "b"): 0.01})
    missing[1]["pairs"] = {}
    assert decide(missing, 1 << 20, 5, 10.0, NO_FLOORS).pairs[0].status == "fail"


def test_record_keeps_gemm_and_pairs_and_expect_reads_them_back() -> None:
    world = _world({"a": [700.0], "b": [690.0]}, {("a", "b"): 0.001})
    d = decide(world, 1 << 20, 5, 10.0, NO_FLOORS)

    class Plan:  # what record reads of a plan without tiers
        node, ranks = "a", ()

    saved = json.loads(json.dumps(to_json(record([], Plan(), d))))  # type: ignore[arg-type]
    assert saved["gemm"]["GPU-a-0"] == {"tflops": 700.0, "n": 8192, "dtype": "bfloat16"}
    assert saved["pairs"]["pair:a,b"]["busbw_gbps"] == d.pairs[0].busbw_gbps
    floors, warnings = decision_floors(recorded_floors(saved), "rec.json", 8192, 1 << 20)
    assert floors.gemm_tflops["GPU-a-0"] == 560.0 and warnings == []  # x 0.8
    assert decide(_world({"a": [500.0], "b": [690.0]}, {}), 1 << 20, 5, 50.0, floors).exclude_hostlist == "a"
    _, warned = decision_floors(recorded_floors(saved), "rec.json", 256, 4 << 20)
    assert len(warned) == 3 and "n=8192, this run uses n=256" in warned[0]
    saved["gemm"]["GPU-a-0"]["tflops"] = "fast"
    with pytest.raises(ValueError, match="gemm.GPU-a-0.tflops"):
        recorded_floors(saved)
    saved["gemm"]["GPU-a-0"] |= {"tflops": 1.0, "dtype": 16}
    with pytest.raises(ValueError, match="gemm.GPU-a-0.dtype is 16"):
        recorded_floors(saved)


# ---- real CPU preflights on loopback nodes ------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(tmp_path: Path, nodes: int) -> Path:
    cfg = tmp_path / "c.yaml"
    lines = [f"    - {{name: n{k:02d}, ip: 127.0.0.1, cpu_workers: 1}}" for k in range(1, nodes + 1)]
    cfg.write_text(
        "cluster:\n  nodes:\n" + "\n".join(lines) + "\n"
        "runtime: {binding: none, mem_policy: none, master_addr: 127.0.0.1}\n"
        "preflight: {size_mib: 1, iters: 9}\n"
    )
    return cfg


def _launchers(cfg: Path, tmp_path: Path, slowed: str, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """One `openclaw-launch preflight --node N` per config node, at once, as srun would start them;
    ``slowed``'s workers take 20 times as long (the test hook: a margin far above the jitter of
    three nodes' gloo on two loaded cores, where 8 times once left a pair inside 10 %)."""
    port, names = str(_free_port()), [f"n{k:02d}" for k in range(1, 4)]
    procs = {}
    for node in names:
        env = {**os.environ, SLOWDOWN_VAR: "20" if node == slowed else "1"}
        args = ["preflight", "--config", str(cfg), "--node", node, "--master-port", port, "--json", *extra]
        args += ["--exclude-file", str(tmp_path / f"exclude-{node}")]
        procs[node] = subprocess.Popen(
            [sys.executable, "-m", "openclaw_launch", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    out = {}
    try:
        for node, p in procs.items():
            stdout, stderr = p.communicate(timeout=GUARD_S)
            out[node] = (p.returncode, stdout, stderr)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def test_loopback_nodes_with_one_slowed_name_and_exclude_it(tmp_path: Path) -> None:
    """Three launchers on 127.0.0.1 (real gloo across them): node n02's GEMM and both of its pairs
    are slow; every node decides the same, exits 4 and writes `n02` for sbatch --exclude."""
    (tmp_path / "exclude-n01").write_text("stale\n")  # replaced, as every run writes its list
    results = _launchers(_config(tmp_path, 3), tmp_path, slowed="n02")
    for node, (code, stdout, stderr) in results.items():
        assert code == EXCLUDED_SOME, f"{node}: {stderr[-3000:]}"
        assert (tmp_path / f"exclude-{node}").read_text() == "n02\n"
        d = json.loads(stdout)["decision"]
        assert json.loads(stdout)["scope"] == "job" and d["rounds"] == 3
        assert [x["node"] for x in d["excluded"]] == ["n02"]
        assert [g["node"] for g in d["gemm"] if g["status"] == "slow"] == ["n02"]
        assert sorted(p["name"] for p in d["pairs"] if p["status"] == "slow") == ["pair:n01,n02", "pair:n02,n03"]
        assert [p["status"] for p in d["pairs"] if p["name"] == "pair:n01,n03"] == ["pass"]


def test_scope_node_measures_one_node_of_a_multinode_plan_alone(tmp_path: Path) -> None:
    """`--scope node`: no other launcher is waited for; the node's GEMM only, no pairs, exit 0."""
    p = subprocess.run(
        [sys.executable, "-m", "openclaw_launch", "preflight", "--config", str(_config(tmp_path, 2))]
        + ["--node", "n02", "--scope", "node", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert doc["scope"] == "node" and doc["decision"]["nodes"] == ["n02"] and doc["decision"]["pairs"] == []
    assert [g["node"] for g in doc["decision"]["gemm"]] == ["n02"]


@pytest.mark.parametrize("value", ["0", "100", "-5", "nan", "inf", "many"])
def test_bad_slow_pct_is_exit_2_naming_the_option(value: str) -> None:
    p = invoke("preflight", "--nproc-per-node", "1", "--slow-pct", value)
    assert p.returncode == 2 and "--slow-pct" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert "[rank" not in p.stdout + p.stderr  # nothing was measured


@pytest.mark.parametrize("target", ["/proc/ex.txt", "DIR", "FILE/under"])
def test_unwritable_exclude_file_is_exit_2_before_measuring(tmp_path: Path, target: str) -> None:
    (tmp_path / "FILE").write_text("x")
    path = target.replace("DIR", str(tmp_path)).replace("FILE", str(tmp_path / "FILE"))
    p = invoke("preflight", "--nproc-per-node", "1", "--exclude-file", path)
    assert p.returncode == 2 and "--exclude-file" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert "[rank" not in p.stdout + p.stderr
