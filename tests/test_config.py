"""The YAML config loader: the operators' format, our extensions, and every error's path and line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from guards import GUARD_S

from openclaw_launch.config.model import Config, Runtime
from openclaw_launch.config.reader import load_config, parse_config
from openclaw_launch.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
BAD = sorted((Path(__file__).parent / "bad_configs").glob("*.yaml"))
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
EXPECT_RE = re.compile(r"^# expect: (.+) line (\d+)$")

U1 = "GPU-7a3b1c9d-ef01-2345-6789-0abcdef12345"
U2 = "GPU-8b4c2d0e-f012-3456-789a-bcdef0123456"

OPERATORS_EXAMPLE = f"""\
cluster:
  nodes:
    - name: node0
      ip: 10.10.1.10
      gpus:
        - uuid: {U1}
          numa_node: 0
          pci_bus_id: "0000:0a:00.0"
          nvlink_peers: ["{U2}"]
runtime:
  enable_mps: true
  mps_max_clients_per_gpu: 2
  nccl_socket_nthreads: 8      # -> NCCL_SOCKET_NTHREADS
  nccl_nthreads: 4             # -> NCCL_NTHREADS
"""


def gpu_config(gpu_lines: str = "", runtime: str = "") -> str:
    """One node with one GPU; extra GPU keys and a runtime block spliced in."""
    text = f"cluster:\n  nodes:\n    - name: node0\n      gpus:\n        - uuid: {U1}\n"
    text += "".join(f"          {line}\n" for line in gpu_lines.splitlines())
    if runtime:
        text += "runtime:\n" + "".join(f"  {line}\n" for line in runtime.splitlines())
    return text


def cpu_config(runtime: str) -> str:
    return "cluster:\n  nodes:\n    - {name: n0, cpu_workers: 1}\nruntime:\n" + "".join(
        f"  {line}\n" for line in runtime.splitlines()
    )


def expectations(path: Path) -> set[str]:
    found = set()
    for line in path.read_text().splitlines():
        m = EXPECT_RE.match(line)
        if m:
            found.add(f"{m.group(1)} (line {m.group(2)})")
    return found


def where(err: ConfigError) -> set[str]:
    return {f"{p.path} (line {p.line})" for p in err.problems}


# -- malformed configs --------------------------------------------------------------------------


def test_enough_bad_configs() -> None:
    assert len(BAD) >= 35
    assert any(len(expectations(p)) >= 3 for p in BAD)


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_config_reports_path_and_line(path: Path) -> None:
    expected = expectations(path)
    assert expected, f"{path.name} has no '# expect:' line"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    err = info.value
    text = str(err)
    for item in expected:
        assert item in text
    assert where(err) == expected  # exactly these problems: no cascade of follow-on errors
    assert "Traceback" not in text and 'File "' not in text
    assert text.splitlines()[0].startswith(str(path))
    assert all(line.startswith("  ") for line in text.splitlines()[1:])


def test_all_problems_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(Path(__file__).parent / "bad_configs" / "three_problems.yaml")
    assert len(info.value.problems) == 3
    assert "3 problem(s)" in str(info.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("runtim: {}\ncluster: {nodes: [{name: a, cpu_workers: 1}]}\n", "did you mean 'runtime'?"),
        (cpu_config("binding: exclusiv"), "did you mean 'exclusive'?"),
        (cpu_config("binding: numa"), "'node', 'exclusive', 'socket', 'explicit', 'none'"),
        (cpu_config('enable_mps: "true"'), "expected a boolean (true or false)"),
        (cpu_config("master_port: true"), "expected an integer from 1 to 65535, got a boolean"),
        (cpu_config("NCCL_DEBUG: INFO"), "runtime.nccl_env"),
        (gpu_config("numa_node: -1"), "write null"),
        ("cluster:\n  nodes:\n    - name: a\n      ip: node-a.example\n      cpu_workers: 1\n", "hostnames"),
        (gpu_config("pci_bus_id: 0a:00"), "0000:0a:00.0"),
        (gpu_config("nvlink_peers: [1]"), "name GPUs by UUID"),
        (cpu_config("env: {X: null}"), "write '' for an empty value"),
        (cpu_config('env: {X: "a\\0b"}'), "NUL"),
        (gpu_config('cpus: ""', runtime="binding: explicit"), "the CPU list is empty"),
        ("cluster: {nodes: [{name: a, cpu_workers: 1}]}\nruntime:\n  cpu_workers: 1\n", "belongs in a node"),
    ],
)
def test_messages_say_what_to_do(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "x.yaml")
    assert fragment in str(info.value)


def test_duplicate_uuid_names_the_first_occurrence() -> None:
    text = (
        "cluster:\n  nodes:\n"
        f"    - name: a\n      gpus:\n        - uuid: {U1}\n"
        f"    - name: b\n      gpus:\n        - uuid: {U1.lower()}\n"
    )
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    (problem,) = info.value.problems
    assert (problem.path, problem.line) == ("cluster.nodes[1].gpus[0].uuid", 8)
    assert "cluster.nodes[0].gpus[0].uuid (line 5)" in problem.message


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the config"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "latin1.yaml").write_bytes(b"cluster: \xff\n")
    with pytest.raises(ConfigError, match="cannot read the config"):
        load_config(tmp_path / "latin1.yaml")


# -- accepted configs ---------------------------------------------------------------------------


def test_operators_example_parses_unchanged() -> None:
    cfg = parse_config(OPERATORS_EXAMPLE, "ops.yaml")
    (node,) = cfg.nodes
    assert (node.name, node.ip, node.is_cpu, node.line) == ("node0", "10.10.1.10", False, 3)
    (gpu,) = node.gpus
    assert gpu.uuid == U1 and gpu.numa_node == 0 and gpu.pci_bus_id == "0000:0a:00.0"
    assert gpu.nvlink_peers == (U2,) and gpu.cpus is None and gpu.line == 6
    rt = cfg.runtime
    assert rt.enable_mps and rt.mps_max_clients_per_gpu == 2
    assert (rt.nccl_socket_nthreads, rt.nccl_nthreads, rt.nccl_env) == (8, 4, {})
    assert (rt.binding, rt.mem_policy, rt.visible_devices, rt.procs_per_gpu) == ("node", "bind", "ordered", 1)
    assert cfg.source == "ops.yaml"
    # the peer is elsewhere and NCCL_NTHREADS=4 is below what NCCL accepts: warnings only
    assert any("nvlink_peers[0] (line 9)" in w for w in cfg.warnings)
    assert any("runtime.nccl_nthreads (line 14)" in w for w in cfg.warnings)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_configs_load(path: Path) -> None:
    assert isinstance(load_config(path), Config)


def test_h200x2_config_matches_the_recorded_host() -> None:
    cfg = load_config(REPO / "configs" / "h200x2.yaml")
    (node,) = cfg.nodes
    assert [(g.uuid, g.pci_bus_id, g.numa_node) for g in node.gpus] == [
        ("GPU-584f87b1-e561-d9a3-aa91-5ea20ea584ee", "0000:00:06.0", None),
        ("GPU-593502f1-407a-3b77-45a0-032830195d52", "0000:00:07.0", None),
    ]
    assert node.gpus[0].nvlink_peers == (node.gpus[1].uuid,)
    assert node.gpus[1].nvlink_peers == (node.gpus[0].uuid,)
    assert cfg.runtime.nccl_env["NCCL_NVLS_ENABLE"] == "0"
    assert cfg.warnings == ()


def test_cpu_only_and_loopback_configs() -> None:
    cpu = load_config(REPO / "configs" / "cpu-only.yaml")
    assert [(n.name, n.ip, n.cpu_workers, n.is_cpu) for n in cpu.nodes] == [("localhost", "127.0.0.1", 2, True)]
    two = load_config(REPO / "configs" / "two-nodes-loopback.yaml")
    assert [(n.name, n.cpu_workers) for n in two.nodes] == [("node0", 2), ("node1", 1)]
    assert two.runtime.master_addr == "127.0.0.1"
    (warning,) = two.warnings
    assert warning.startswith("cluster.nodes[1].ip (line 11):") and "several agents on one host" in warning


def test_defaults() -> None:
    cfg = parse_config("cluster:\n  nodes:\n    - {name: n0, cpu_workers: 3}\n")
    assert cfg.runtime == Runtime()
    assert cfg.warnings == ()


@pytest.mark.parametrize(
    ("written", "normalised"),
    [
        ('"00000000:0A:00.0"', "0000:0a:00.0"),  # NVML's form
        ('"0000:0A:00.0"', "0000:0a:00.0"),
        ("0000:00:06.0", "0000:00:06.0"),  # unquoted: YAML 1.1 would make this the number 6.0
        ("0a:00.0", "0000:0a:00.0"),
    ],
)
def test_bus_id_normalised(written: str, normalised: str) -> None:
    cfg = parse_config(gpu_config(f"pci_bus_id: {written}"))
    assert cfg.nodes[0].gpus[0].pci_bus_id == normalised


def test_uuids_kept_as_written_and_compared_case_insensitively() -> None:
    upper = U1.upper()
    mig = "MIG-0d5f9e2a-1b3c-4d5e-8f70-a1b2c3d4e5f6"
    text = (
        "cluster:\n  nodes:\n    - name: n0\n      gpus:\n"
        f"        - uuid: {upper}\n          nvlink_peers: [{U2.upper()}]\n"
        f"        - uuid: {U2}\n          nvlink_peers: [{U1}]\n"
        f"        - uuid: {mig}\n          numa_node: null\n"
    )
    cfg = parse_config(text)
    assert [g.uuid for g in cfg.nodes[0].gpus] == [upper, U2, mig]
    assert cfg.warnings == ()  # peers matched regardless of case


def test_explicit_cpus_as_cpulist_or_list() -> None:
    text = (
        "runtime: {binding: explicit}\ncluster:\n  nodes:\n    - name: n0\n      gpus:\n"
        f'        - uuid: {U1}\n          cpus: "0-3,64-65"\n'
        f"        - uuid: {U2}\n          cpus: [9, 8, 8]\n"
    )
    gpus = parse_config(text).nodes[0].gpus
    assert gpus[0].cpus == (0, 1, 2, 3, 64, 65)
    assert gpus[1].cpus == (8, 9)


def test_mps_with_several_procs_per_gpu() -> None:
    rt = parse_config(
        gpu_config(
            runtime="enable_mps: true\nmps_max_clients_per_gpu: 4\nprocs_per_gpu: 4\n"
            "mps_active_thread_percentage: 50\nmps_pinned_device_mem_limit: 40G\nmps_on_start_failure: warn"
        )
    ).runtime
    assert (rt.procs_per_gpu, rt.mps_active_thread_percentage, rt.mps_pinned_device_mem_limit) == (4, 50, "40G")
    assert rt.mps_on_start_failure == "warn"


def test_all_runtime_extensions() -> None:
    rt = parse_config(
        cpu_config(
            "binding: exclusive\nmem_policy: preferred\nvisible_devices: isolated\nmaster_addr: head-node.example\n"
            "master_port: 29501\nstrictness: warn\nnccl_env: {NCCL_DEBUG: INFO}\nenv: {OMP_NUM_THREADS: 4}"
        )
    ).runtime
    assert (rt.binding, rt.mem_policy, rt.visible_devices, rt.strictness) == (
        "exclusive",
        "preferred",
        "isolated",
        "warn",
    )
    assert (rt.master_addr, rt.master_port) == ("head-node.example", 29501)
    assert rt.nccl_env == {"NCCL_DEBUG": "INFO"} and rt.env == {"OMP_NUM_THREADS": "4"}


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("NCCL_MIN_NRINGS", "4", "NCCL_MIN_NCHANNELS"),
        ("NCCL_MAX_NRINGS", "8", "NCCL_MAX_NCHANNELS"),
        ("NCCL_LL_THRESHOLD", "0", "NCCL_PROTO"),
        ("NCCL_TREE_THRESHOLD", "0", "NCCL_ALGO"),
        ("NCCL_IB_CUDA_SUPPORT", "1", "NCCL_NET_GDR_LEVEL"),
        ("NCCL_P2P_LEVEL", "2", "LOC, NVL, PIX, PXB, PHB or SYS"),
    ],
)
def test_deprecated_nccl_variables_warn(name: str, value: str, fragment: str) -> None:
    for block in ("nccl_env", "env"):
        cfg = parse_config(cpu_config(f"{block}:\n  {name}: {value}"))
        (warning,) = cfg.warnings
        assert warning.startswith(f"runtime.{block}.{name} (line 6):") and fragment in warning


def test_named_p2p_level_does_not_warn() -> None:
    assert parse_config(cpu_config("nccl_env: {NCCL_P2P_LEVEL: NVL}")).warnings == ()


def test_same_socket_threads_in_both_places_is_fine() -> None:
    cfg = parse_config(cpu_config("nccl_socket_nthreads: 4\nnccl_env: {NCCL_SOCKET_NTHREADS: 4}"))
    assert cfg.runtime.nccl_socket_nthreads == 4 and cfg.runtime.nccl_env == {"NCCL_SOCKET_NTHREADS": "4"}


def test_mps_settings_without_mps_warn() -> None:
    (warning,) = parse_config(cpu_config("mps_max_clients_per_gpu: 2")).warnings
    assert "runtime.mps_max_clients_per_gpu (line 5)" in warning and "enable_mps" in warning


def test_env_values_are_literal() -> None:
    """Nothing is ever given to a shell: these reach the workers character for character."""
    text = cpu_config(
        "env:\n"
        "  A: $(rm -rf /); echo pwned\n"
        '  B: "it\'s \\"quoted\\""\n'
        '  C: "line1\\nline2"\n'
        "  D: |\n"
        "    multi\n"
        "    line\n"
        "  E: '`id` && true || false > /tmp/x'\n"
        "  F: 0.10\n"
        "  G: 010\n"
        "  H: yes\n"
        "  I: ''\n"
        "nccl_env:\n"
        "  NCCL_SOCKET_IFNAME: ^docker0,lo;$HOME\n"
    )
    rt = parse_config(text).runtime
    assert rt.env == {
        "A": "$(rm -rf /); echo pwned",
        "B": 'it\'s "quoted"',
        "C": "line1\nline2",
        "D": "multi\nline\n",
        "E": "`id` && true || false > /tmp/x",
        "F": "0.10",
        "G": "010",
        "H": "yes",
        "I": "",
    }
    assert rt.nccl_env == {"NCCL_SOCKET_IFNAME": "^docker0,lo;$HOME"}


def test_anchors_and_aliases_are_fine() -> None:
    text = (
        "cluster:\n  nodes:\n    - {name: a, ip: 10.0.0.1, cpu_workers: &w 2}\n"
        "    - {name: b, ip: 10.0.0.2, cpu_workers: *w}\n"
    )
    assert [n.cpu_workers for n in parse_config(text).nodes] == [2, 2]


def test_loading_imports_nothing_heavy() -> None:
    code = (
        "import sys; import openclaw_launch.config.reader as c; c.load_config(sys.argv[1]); "
        "heavy = {'torch', 'pynvml', 'numpy', 'psutil'} & set(sys.modules); print(sorted(heavy))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(REPO / "configs" / "h200x2.yaml")],
        capture_output=True,
        text=True,
        check=True,
        timeout=GUARD_S,
    )
    assert out.stdout.strip() == "[]"
