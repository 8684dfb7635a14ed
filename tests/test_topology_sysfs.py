from __future__ import annotations

from pathlib import Path

from topo_helpers import DATA, write_sysfs

from openclaw_launch.topology.model import IbPort
from openclaw_launch.topology.sysfs import read_pci_device, read_sysfs

AER_COR = "RxErr 2\nBadTLP 3\nBadDLLP 0\nRollover 0\nTimeout 2\nNonFatalErr 0\nTOTAL_ERR_COR 7\n"
AER_NONFATAL = "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 1\nTOTAL_ERR_NONFATAL 1\n"
AER_FATAL = "Undefined 0\nDLP 0\nTOTAL_ERR_FATAL 0\n"


def two_socket(root: Path) -> Path:
    """2 sockets x 4 cores x 2 threads; Linux numbering: cpu i and i+8 are siblings."""
    return write_sysfs(
        root,
        numa_nodes={0: [0, 1, 2, 3, 8, 9, 10, 11], 1: [4, 5, 6, 7, 12, 13, 14, 15]},
        siblings=[(i, i + 8) for i in range(8)],
        sockets={c: 0 if c % 8 < 4 else 1 for c in range(16)},
        pci={
            "0000:1b:00.0": {
                "numa_node": "1",
                "local_cpulist": "4-7,12-15",
                "aer_dev_correctable": AER_COR,
                "aer_dev_nonfatal": AER_NONFATAL,
                "aer_dev_fatal": AER_FATAL,
            },
            "0000:3d:00.0": {"numa_node": "-1", "local_cpulist": "0-15"},
        },
    )


def test_two_numa_nodes_with_hyperthreads(tmp_path: Path) -> None:
    facts = read_sysfs(two_socket(tmp_path), ["0000:1B:00.0", "00000000:3d:00.0"])
    assert facts.cpus == tuple(range(16))
    assert facts.numa_nodes == {0: (0, 1, 2, 3, 8, 9, 10, 11), 1: (4, 5, 6, 7, 12, 13, 14, 15)}
    assert facts.core_of[9] == 1 and facts.core_of[1] == 1 and facts.core_of[15] == 7
    assert facts.socket_of[12] == 1 and facts.socket_of[11] == 0
    gpu = facts.pci["0000:1b:00.0"]
    assert (gpu.present, gpu.numa_node, gpu.local_cpus) == (True, 1, (4, 5, 6, 7, 12, 13, 14, 15))
    assert gpu.aer == {"correctable": 7, "nonfatal": 1, "fatal": 0}


def test_numa_node_minus_one_is_none(tmp_path: Path) -> None:
    facts = read_pci_device(two_socket(tmp_path), "0000:3d:00.0")
    assert facts.present and facts.numa_node is None
    assert facts.local_cpus == tuple(range(16)) and facts.aer is None


def test_h200_tree() -> None:
    facts = read_sysfs(DATA / "sysfs" / "h200x2", ["00000000:00:06.0", "00000000:00:07.0"])
    assert facts.numa_nodes == {0: tuple(range(32))}
    assert facts.core_of == {c: c for c in range(32)} and set(facts.socket_of.values()) == {0}
    assert [(p.numa_node, p.local_cpus) for p in facts.pci.values()] == [(None, tuple(range(32)))] * 2


def test_no_node_directory_means_one_node(tmp_path: Path) -> None:
    root = write_sysfs(tmp_path, numa_nodes=None, siblings=[(0,), (1,), (2,)])
    facts = read_sysfs(root)
    assert facts.numa_nodes == {0: (0, 1, 2)}
    assert facts.socket_of == {}  # no physical_package_id files


def test_memory_only_node_left_out(tmp_path: Path) -> None:
    root = write_sysfs(tmp_path, numa_nodes={0: [0, 1], 1: []}, siblings=[(0,), (1,)])
    assert read_sysfs(root).numa_nodes == {0: (0, 1)}


def test_missing_and_broken_files_are_unknown(tmp_path: Path) -> None:
    root = write_sysfs(
        tmp_path,
        numa_nodes={0: [0, 1]},
        pci={"0000:0a:00.0": {"numa_node": "garbage", "local_cpulist": "0-x", "aer_dev_fatal": "nonsense"}},
    )
    facts = read_sysfs(root, ["0a:00.0", "0000:0b:00.0"])
    assert facts.core_of == {0: 0, 1: 1}  # no topology dirs: each CPU its own core
    broken, absent = facts.pci["0000:0a:00.0"], facts.pci["0000:0b:00.0"]
    assert (broken.present, broken.numa_node, broken.local_cpus, broken.aer) == (True, None, None, None)
    assert (absent.present, absent.numa_node) == (False, None)


def test_empty_root_does_not_crash(tmp_path: Path) -> None:
    facts = read_sysfs(tmp_path, ["0000:00:06.0"])
    assert (facts.cpus, dict(facts.numa_nodes), facts.infiniband) == ((), {}, ())


def test_aer_without_total_line_is_summed(tmp_path: Path) -> None:
    root = write_sysfs(
        tmp_path, numa_nodes={0: [0]}, pci={"0000:0a:00.0": {"aer_dev_correctable": "RxErr 2\nBadTLP 5"}}
    )
    assert read_pci_device(root, "0000:0a:00.0").aer == {"correctable": 7}


def test_infiniband_ports(tmp_path: Path) -> None:
    root = write_sysfs(
        tmp_path,
        numa_nodes={0: [0]},
        infiniband={
            "mlx5_0": {
                1: {
                    "state": "4: ACTIVE",
                    "counters/symbol_error": "3",
                    "counters/link_downed": "1",
                    "counters/port_xmit_data": "123456789",
                    "counters/weird": "n/a",
                },
            },
            "mlx5_1": {1: {"state": "1: DOWN"}},
        },
    )
    ports = read_sysfs(root).infiniband
    assert ports == (
        IbPort("mlx5_0", 1, "4: ACTIVE", {"link_downed": 1, "port_xmit_data": 123456789, "symbol_error": 3}),
        IbPort("mlx5_1", 1, "1: DOWN", {}),
    )
