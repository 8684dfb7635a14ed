"""The GPUs from the NVIDIA driver's /proc files, without NVML: the start path of ``run``.

The 1-GPU H200 host as recorded there (tests/data/hosts/h200x1: the driver's ``information`` file,
sysfs, with what nvidia-smi said on the same lease), and the 2x H200 host's recorded sysfs tree with
``information`` files in the same driver format, holding that host's recorded UUIDs and bus ids.
NVML is injected: a provider whose start fails the test (or raises NVML's mismatch error)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from guards import GUARD_S
from topo_helpers import DATA, h200_nvml

from openclaw_launch.cli.main import cli
from openclaw_launch.topology import live
from openclaw_launch.topology.live import NvmlBroken, discover_topology
from openclaw_launch.topology.model import normalize_bus_id
from openclaw_launch.topology.nvml import NvmlProvider, NvmlUnavailable
from openclaw_launch.topology.procfs import (
    DRIVER_GPUS_DIR,
    DriverGpu,
    minor_to_bus_id,
    read_driver_gpus,
    usable_driver_gpus,
)

H200X1 = DATA / "hosts" / "h200x1"
H200X1_UUID = "GPU-320daf9d-121c-2735-d9e7-28ba9c114ecf"
INFORMATION = (H200X1 / DRIVER_GPUS_DIR / "0000:00:06.0" / "information").read_text()
H200X2_DEVICES = json.loads((DATA / "nvml" / "h200x2.json").read_text())["devices"]
H200X2_UUIDS = [d["uuid"] for d in H200X2_DEVICES]
MISMATCH = "RM has detected an NVML/RM version mismatch."  # str() of pynvml's LibRmVersionMismatch


def nvml_must_not_start() -> NvmlProvider:
    raise AssertionError("NVML was started on a path that needs none of its answers")


def mismatched_nvml() -> NvmlProvider:
    """``PynvmlProvider`` after a driver upgrade without reboot: its start raises."""
    raise NvmlUnavailable(f"NVML could not start ({MISMATCH}); is the NVIDIA driver loaded?")


def h200x2_tree(root: Path) -> Path:
    """The 2x H200 host: its recorded sysfs tree, and driver files in the recorded format with the
    UUIDs and bus ids its NVML recording holds (device minors 0 and 1)."""
    shutil.copytree(DATA / "sysfs" / "h200x2", root, dirs_exist_ok=True)
    for minor, device in enumerate(H200X2_DEVICES):
        bus = normalize_bus_id(device["pci_bus_id"])
        text = INFORMATION.replace(H200X1_UUID, device["uuid"]).replace("0000:00:06.0", bus)
        entry = root / DRIVER_GPUS_DIR / bus
        entry.mkdir(parents=True)
        (entry / "information").write_text(text.replace("Device Minor: \t 0", f"Device Minor: \t {minor}"))
        (root / "dev").mkdir(exist_ok=True)
        (root / "dev" / f"nvidia{minor}").touch()
    return root


def test_the_recorded_information_file() -> None:
    assert "GPU UUID: \t " in INFORMATION  # the driver's tabs, as recorded
    assert read_driver_gpus(H200X1) == (DriverGpu("0000:00:06.0", H200X1_UUID, "NVIDIA H200", 0, False),)
    assert minor_to_bus_id(H200X1) == {0: "0000:00:06.0"}


def test_h200x1_without_nvml_says_what_nvml_said_there() -> None:
    topo = discover_topology(H200X1, open_nvml=nvml_must_not_start, nvml_facts=False, environ={})
    [gpu] = topo.gpus
    [smi] = list(csv.DictReader((H200X1 / "query.csv").read_text().splitlines(), skipinitialspace=True))
    assert (str(gpu.index), gpu.uuid, gpu.name) == (smi["index"], smi["uuid"], smi["name"])
    assert gpu.pci_bus_id == normalize_bus_id(smi["pci.bus_id"])
    # sysfs numa_node is -1 in that VM: the one node holding the GPU's local CPUs, as nvidia-smi says
    assert gpu.numa_node == 0 and gpu.cpu_affinity == tuple(range(16))
    assert "NUMA Affinity" in (H200X1 / "nvidia-smi-topo-m.txt").read_text()
    assert topo.numa_nodes == {0: tuple(range(16))} and topo.allowed_mems == (0,)
    assert (gpu.nvlinks, gpu.pcie, gpu.ecc_uncorrected, topo.links) == ((), None, None, {})  # NVML's alone


def test_h200x2_driver_files_and_nvml_agree_on_what_the_plan_reads(tmp_path: Path) -> None:
    root = h200x2_tree(tmp_path)
    fast = discover_topology(root, open_nvml=nvml_must_not_start, nvml_facts=False, environ={})
    full = discover_topology(root, h200_nvml())
    plan_facts = [(g.index, g.uuid, g.pci_bus_id, g.name, g.numa_node, g.cpu_affinity) for g in fast.gpus]
    assert plan_facts == [(g.index, g.uuid, g.pci_bus_id, g.name, g.numa_node, g.cpu_affinity) for g in full.gpus]
    assert (fast.numa_nodes, fast.core_of, fast.allowed_cpus) == (full.numa_nodes, full.core_of, full.allowed_cpus)
    assert fast.links == {} and full.links == {(0, 1): "NV18", (1, 0): "NV18"}


def test_nvml_where_the_driver_files_may_not_be_what_nvml_lists(tmp_path: Path) -> None:
    root = h200x2_tree(tmp_path)
    assert usable_driver_gpus(root, {}) is not None
    # Slurm fences its GPUs with cgroup rules; /proc lists every GPU of the node
    assert usable_driver_gpus(root, {"SLURM_STEP_GPUS": "1"}) is None
    with pytest.raises(NvmlBroken, match="version mismatch"):
        discover_topology(root, open_nvml=mismatched_nvml, nvml_facts=False, environ={"SLURM_JOB_GPUS": "0"})
    (root / "dev" / "nvidia1").unlink()  # a container given only /dev/nvidia0 still sees both in /proc
    assert usable_driver_gpus(root, {}) is None
    (root / "dev" / "nvidia1").touch()
    information = root / DRIVER_GPUS_DIR / "0000:00:07.0" / "information"
    information.write_text(information.read_text().replace("GPU Excluded:\t No", "GPU Excluded:\t Yes"))
    driver = usable_driver_gpus(root, {})  # an excluded GPU is nobody's, NVML's neither
    assert driver is not None and driver.device_count() == 1 and driver.pci_bus_id(0) == "0000:00:06.0"
    information.write_text("Model: \t\t NVIDIA H200\n")  # a format we do not know: ask NVML
    assert usable_driver_gpus(root, {}) is None
    assert usable_driver_gpus(tmp_path / "no-driver", {}) is None


@pytest.fixture
def h200x2_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's host is the 2x H200 one; NVML, where started, says a driver/library mismatch."""
    root = h200x2_tree(tmp_path / "host")
    monkeypatch.setattr(live, "HOST_ROOT", root)
    monkeypatch.setattr(live, "PynvmlProvider", mismatched_nvml)
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_JOB_ID"):
        monkeypatch.delenv(var, raising=False)
    return root


def _config(tmp_path: Path, peers: bool) -> str:
    """The 2x H200 host as a config, its GPUs listing each other as NVLink peers or not."""
    lines = ["cluster:", "  nodes:", "    - name: h200", "      ip: 127.0.0.1", "      gpus:"]
    for uuid, peer in zip(H200X2_UUIDS, H200X2_UUIDS[::-1], strict=True):
        lines.append(f'        - uuid: "{uuid}"')
        if peers:
            lines.append(f'          nvlink_peers: ["{peer}"]')
    path = tmp_path / f"peers-{peers}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    assert "Traceback" not in result.output
    return result.exit_code, result.output


@pytest.mark.usefixtures("h200x2_host")
def test_plan_without_nvlinks_asks_nvml_nothing() -> None:
    code, out = _invoke("plan", "--json", "--nproc-per-node", "2", "train.py")
    assert code == 0, out
    plan = json.loads(out)
    assert plan["backend"] == "nccl"
    assert [r["gpu_uuid"] for r in plan["ranks"]] == H200X2_UUIDS


@pytest.mark.usefixtures("h200x2_host")
def test_nvml_is_asked_where_the_plan_needs_nvlinks(tmp_path: Path) -> None:
    # --tp: this host's NVLinks become the TP groups; discover, validate: NVML's facts are the point
    for args in (["plan", "--nproc-per-node", "2", "--tp", "2", "train.py"], ["discover"]):
        code, out = _invoke(*args)
        assert code == 2 and MISMATCH in out and "--nproc-per-node cpu" in out, (args, out)
    code, out = _invoke("plan", "--config", _config(tmp_path, peers=True), "train.py")  # peers are checked
    assert code == 2 and MISMATCH in out, out
    code, out = _invoke("plan", "--config", _config(tmp_path, peers=False), "train.py")
    assert code == 0, out


def test_the_start_path_never_imports_pynvml(tmp_path: Path) -> None:
    """In a fresh interpreter (pynvml is installed here): ``plan`` reads the recorded H200 host."""
    root = h200x2_tree(tmp_path)
    code = (
        "import sys; from pathlib import Path; from openclaw_launch.topology import live; "
        f"live.HOST_ROOT = Path({str(root)!r}); from openclaw_launch.cli.main import cli; "
        "cli(['plan', '--json', '--nproc-per-node', '2', 'train.py'], standalone_mode=False); "
        "print('PYNVML', 'pynvml' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=GUARD_S)
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith("PYNVML False") and '"backend": "nccl"' in out.stdout


def test_the_real_nvml_is_read_in_a_forked_child_and_comes_back_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML's start leaves a thread of the CUDA driver's in its process (it outlives nvmlShutdown,
    seen on the H200 host), and the launcher forks afterwards: the live host's NVML facts are read
    in a child and come back as a snapshot, the host this process would have read."""
    root = h200x2_tree(tmp_path / "host")
    opened_in = tmp_path / "opened-in"

    def nvml_here() -> NvmlProvider:
        opened_in.write_text(str(os.getpid()))
        return h200_nvml()

    monkeypatch.setattr(live, "HOST_ROOT", root)
    monkeypatch.setattr(live, "PynvmlProvider", nvml_here)
    apart = discover_topology()
    assert int(opened_in.read_text()) != os.getpid()  # started in the child, never here
    assert apart == discover_topology(open_nvml=h200_nvml)  # the same host, its NVML in this process
    assert len(apart.gpus) == 2 and apart.links
