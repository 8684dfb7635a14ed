from __future__ import annotations

import pytest

from openclaw_launch.topology.cpulist import format_cpulist, parse_cpulist
from openclaw_launch.topology.model import normalize_bus_id


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,8", (0, 1, 2, 3, 8)),
        ("0-1,48-49\n", (0, 1, 48, 49)),
        (" 5 , 2-3 ", (2, 3, 5)),
        ("3,1,3", (1, 3)),
        ("", ()),
        ("\n", ()),
    ],
)
def test_parse_cpulist(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["a", "0-", "-3", "3-1", "0,,2", "0-3;8", "1.5", "0 1"])
def test_parse_cpulist_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="CPU list"):
        parse_cpulist(text)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [((), ""), ((7,), "7"), ((0, 1, 2, 3, 8), "0-3,8"), ((0, 2, 4), "0,2,4"), ((1, 0, 2, 2), "0-2")],
)
def test_format_cpulist(cpus: tuple[int, ...], text: str) -> None:
    assert format_cpulist(cpus) == text


@pytest.mark.parametrize("text", ["0-23,48-71", "0,2,4,6,8,10", "0-55,112-167", "7"])
def test_round_trip(text: str) -> None:
    assert format_cpulist(parse_cpulist(text)) == text


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("00000000:00:06.0", "0000:00:06.0"),
        ("0000:00:07.0", "0000:00:07.0"),
        ("00000000:0A:00.0", "0000:0a:00.0"),
        ("0a:00.0", "0000:0a:00.0"),
        (" 0001:C1:1F.7\n", "0001:c1:1f.7"),
    ],
)
def test_normalize_bus_id(raw: str, norm: str) -> None:
    assert normalize_bus_id(raw) == norm


@pytest.mark.parametrize("raw", ["", "GPU-1234", "0000:0a:00.8", "0000:0a:00", "zz:00.0"])
def test_normalize_bus_id_rejects(raw: str) -> None:
    with pytest.raises(ValueError, match="PCI bus id"):
        normalize_bus_id(raw)
