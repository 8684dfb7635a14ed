"""The command line as users meet it: real `python -m openclaw_launch` processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BAD = sorted((ROOT / "tests" / "bad_configs").glob("*.yaml"))
SNAPSHOT = ROOT / "configs" / "h200x2.snapshot.json"


def launcher(*args: str, timeout_s: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "openclaw_launch", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
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
    proc = launcher(command, "--config", str(path), *extra)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    for where in expected_locations(path):
        assert where in proc.stderr


def test_missing_uuid_lists_the_gpus_that_are_there(tmp_path: Path) -> None:
    cfg = tmp_path / "x.yaml"
    cfg.write_text(
        "cluster:\n  nodes:\n    - name: n0\n      gpus:\n        - uuid: GPU-00000000-1111-2222-3333-444444444444\n"
    )
    proc = launcher("plan", "--config", str(cfg), "--topology", str(SNAPSHOT))
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
        timeout=60,
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
    assert launcher("--nproc-per-node", "0", "x.py").returncode == 2
    assert launcher("run").returncode == 2
    env = {**os.environ, "SLURM_NODEID": "5"}
    proc = launcher("plan", "--config", "configs/two-nodes-loopback.yaml", env=env)
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
    bad = launcher("report", str(tmp_path / "other.json"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
