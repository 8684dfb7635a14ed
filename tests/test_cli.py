"""The command line as users meet it: real `python -m openclaw_launch` processes; the usage errors
in this process (tests/cli_runner.py), each family with one case through the real entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import invoke
from guards import GUARD_S

ROOT = Path(__file__).resolve().parent.parent
BAD = sorted((ROOT / "tests" / "bad_configs").glob("*.yaml"))
SNAPSHOT = ROOT / "configs" / "h200x2.snapshot.json"


def launcher(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "openclaw_launch", *args],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        cwd=ROOT,
        **kw,  # type: ignore[call-overload]
    )


def expected_locations(path: Path) -> list[str]:
    return [
        f"{line.split()[2]} (line {line.split()[4]})"
        for line in path.read_text().splitlines()
        if line.startswith("# expect:")
    ]


@pytest.mark.parametrize("path", BAD[:: max(1, len(BAD) // 12)], ids=lambda p: p.stem)
@pytest.mark.parametrize("command", ["plan", "validate", "run"])
def test_bad_config_exits_2_naming_path_and_line(path: Path, command: str) -> None:
    extra = ["--", "examples/train.py"] if command != "validate" else []
    through_the_entry_point = path == BAD[0] and command == "run"
    proc = (launcher if through_the_entry_point else invoke)(command, "--config", str(path), *extra)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    for where in expected_locations(path):
        assert where in proc.stderr


def test_missing_uuid_lists_the_gpus_that_are_there(tmp_path: Path) -> None:
    cfg = tmp_path / "x.yaml"
    cfg.write_text(
        "cluster:\n  nodes:\n    - name: n0\n      gpus:\n        - uuid: GPU-00000000-1111-2222-3333-444444444444\n"
    )
    proc = invoke("plan", "--config", str(cfg), "--topology", str(SNAPSHOT))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "GPU-00000000-1111-2222-3333-444444444444" in proc.stderr
    assert "GPU-584f87b1-e561-d9a3-aa91-5ea20ea584ee" in proc.stderr  # what the host has


def test_plan_json_schema_for_h200() -> None:
    proc = launcher(
        "plan",
        "--config",
        "configs/h200x2.yaml",
        "--topology",
        str(SNAPSHOT),
        "--json",
        "--",
        "train.py",
        "--lr",
        "$(rm -rf /);'\"",
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["schema"] == 1
    keys = {"rank", "local_rank", "node", "gpu_uuid", "pci_bus_id", "numa_node", "cpus", "mem_policy", "argv", "env"}
    for r in plan["ranks"]:
        assert keys <= r.keys()
        assert r["argv"][-2:] == ["--lr", "$(rm -rf /);'\""]  # literal, no shell
        assert r["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert r["env"]["NCCL_NVLS_ENABLE"] == "0"
    assert [r["pci_bus_id"] for r in plan["ranks"]] == ["0000:00:06.0", "0000:00:07.0"]
    nccl = [{k: v for k, v in r["env"].items() if k.startswith("NCCL_")} for r in plan["ranks"]]
    assert nccl[0] == nccl[1]


def test_plan_never_imports_torch() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "openclaw_launch",
            "plan",
            "--config",
            "configs/h200x2.yaml",
            "--topology",
            str(SNAPSHOT),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=GUARD_S,
    )
    assert proc.returncode == 0, proc.stderr
    modules = {ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if "|" in ln}
    assert not any(m == "torch" or m.startswith("torch.") for m in modules)


def test_validate_snapshot_passes_with_numa_warning() -> None:
    proc = launcher("validate", "--config", "configs/h200x2.yaml", "--topology", str(SNAPSHOT))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 failed" in proc.stdout


def test_validate_cpu_config_on_this_host() -> None:
    proc = launcher("validate", "--config", "configs/cpu-only.yaml", "--json")
    assert proc.returncode in (0, 1), proc.stderr
    assert json.loads(proc.stdout)["schema"] == 1


def test_discover_on_this_host_loads_and_plans(tmp_path: Path) -> None:
    proc = launcher("discover", "--node-name", "here")
    assert proc.returncode == 0, proc.stderr
    cfg = tmp_path / "here.yaml"
    cfg.write_text(proc.stdout)
    plan = launcher("plan", "--config", str(cfg), "--json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["ranks"]


def test_dry_run_starts_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    proc = launcher("--nproc-per-node", "2", "--dry-run", "--no-python", "--", "touch", str(marker))
    assert proc.returncode == 0, proc.stderr
    assert "touch" in proc.stdout and not marker.exists()


def test_unknown_subcommand_is_the_script() -> None:
    proc = launcher("--nproc-per-node", "1", "--no-python", "--", "true")
    assert proc.returncode == 0, proc.stderr


def test_usage_errors_exit_2() -> None:
    assert invoke("--nproc-per-node", "0", "x.py").returncode == 2
    assert invoke("run").returncode == 2
    env = {**os.environ, "SLURM_NODEID": "5"}
    proc = invoke("plan", "--config", "configs/two-nodes-loopback.yaml", env=env)
    assert proc.returncode == 2 and "SLURM_NODEID=5" in proc.stderr


def test_module_entry_runs_python_dash_m() -> None:
    proc = launcher("--nproc-per-node", "1", "-m", "platform")
    assert proc.returncode == 0, proc.stderr
    assert "[rank 0] Linux" in proc.stdout


def test_report_renders_a_saved_run_and_rejects_other_files(tmp_path: Path) -> None:
    report = tmp_path / "run.json"
    done = launcher("--nproc-per-node", "2", "--report", str(report), "--no-python", "--", "true")
    assert done.returncode == 0, done.stderr
    shown = launcher("report", str(report))
    assert shown.returncode == 0 and "exit 0" in shown.stdout and "bound cpus" in shown.stdout
    (tmp_path / "other.json").write_text("{}")
    bad = invoke("report", str(tmp_path / "other.json"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


SMI = ROOT / "tests" / "data" / "topologies" / "h200x2"


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (arguments, what the one-line message must say)."""
    (tmp / "empty.yaml").write_text("")
    (tmp / "list.yaml").write_text("- a\n- b\n")
    (tmp / "snap.json").write_text('{"schema": "openclaw-topology/0"}')
    (tmp / "notes.txt").write_text("hello\n")
    (tmp / "dir").mkdir()
    (tmp / "file").write_text("")
    h200 = ["--config", "configs/h200x2.yaml"]
    return {
        "missing_config": (["plan", "--config", str(tmp / "nope.yaml")], "cannot read the config"),
        "config_is_a_directory": (["plan", "--config", str(tmp / "dir")], "is a directory"),
        "empty_config": (["plan", "--config", str(tmp / "empty.yaml")], "the config is empty"),
        "config_is_a_list": (["validate", "--config", str(tmp / "list.yaml")], "got a list"),
        "snapshot_wrong_schema": (["plan", *h200, "--topology", str(tmp / "snap.json")], "openclaw-topology/1"),
        "topology_is_a_config": (["plan", *h200, "--topology", "configs/h200x2.yaml"], "is a config, not a topology"),
        "unknown_node": (["validate", *h200, "--node", "nope"], "the config has: h200x2"),
        "node_without_config": (["plan", "--node", "n0", "--", "x.py"], "--node names a node of --config"),
        "from_smi_not_smi": (["discover", "--from-smi", str(tmp / "notes.txt")], f"{tmp / 'notes.txt'}: nvidia-smi"),
        "smi_list_alone": (["discover", "--smi-list", str(SMI / "nvidia-smi-L.txt")], "give --from-smi"),
        "output_unwritable": (
            [
                "discover",
                "--from-smi",
                str(SMI / "nvidia-smi-topo-m.txt"),
                "--smi-list",
                str(SMI / "nvidia-smi-L.txt"),
                "-o",
                str(tmp / "file" / "x.yaml"),
            ],
            "cannot write",
        ),
    }


BAD_INPUT_NAMES = [
    "missing_config",
    "config_is_a_directory",
    "empty_config",
    "config_is_a_list",
    "snapshot_wrong_schema",
    "topology_is_a_config",
    "unknown_node",
    "node_without_config",
    "from_smi_not_smi",
    "smi_list_alone",
    "output_unwritable",
]


@pytest.mark.parametrize("name", BAD_INPUT_NAMES)
def test_bad_input_exits_2_with_a_clear_message(tmp_path: Path, name: str) -> None:
    args, says = _bad_inputs(tmp_path)[name]
    proc = (launcher if name == BAD_INPUT_NAMES[0] else invoke)(*args)  # one through the entry point
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and says in proc.stderr, proc.stderr
    assert proc.stdout == ""


def test_validate_counts_mps_clients_per_gpu_in_plan_order(tmp_path: Path) -> None:
    """The daemon numbers devices by its CUDA_VISIBLE_DEVICES: the config's GPUs in order."""
    cfg = tmp_path / "mps.yaml"
    text = (ROOT / "configs" / "h200x2.yaml").read_text()
    cfg.write_text(text.replace("enable_mps: false", "enable_mps: true\n  mps_max_clients_per_gpu: 1"))
    fake = ROOT / "tests" / "fake_mps"
    env = {
        **os.environ,
        "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}",
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "log"),
        "FAKE_MPS_SERVERS": "4242:11,12,13",
        "FAKE_MPS_DEVICE_CLIENTS": "0:11,12;1:13",
    }
    for d in ("pipe", "log"):
        (tmp_path / d).mkdir()
    control = str(fake / "nvidia-cuda-mps-control")
    assert subprocess.run([control, "-d"], env=env, timeout=GUARD_S).returncode == 0
    try:
        proc = launcher("validate", "--config", str(cfg), "--topology", str(SNAPSHOT), "--json", env=env)
    finally:
        subprocess.run([control], input="quit\n", text=True, env=env, timeout=GUARD_S)
    checks = json.loads(proc.stdout)["checks"]
    per_gpu = {c["subject"].split()[2]: (c["status"], c["found"]) for c in checks if c["name"] == "mps_clients"}
    assert per_gpu == {
        "GPU-584f87b1-e561-d9a3-aa91-5ea20ea584ee": ("fail", "2"),
        "GPU-593502f1-407a-3b77-45a0-032830195d52": ("pass", "1"),
    }
    assert proc.returncode == 1
