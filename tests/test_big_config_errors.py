"""A config of 10 000 nodes gives bounded error lines (issue 32 item 9: the list of valid names was
one line of 69 000 characters): the first names and how many more, exit 2, in process."""

from __future__ import annotations

from pathlib import Path

from cli_runner import invoke

from openclaw_launch.limits import MAX_LISTED, listed


def big_config(tmp_path: Path, n: int = 10_000) -> Path:
    lines = ["cluster:", "  nodes:"]
    lines += [
        f"    - {{name: n{i}, ip: 10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}, cpu_workers: 1}}" for i in range(n)
    ]
    path = tmp_path / "big.yaml"
    path.write_text("\n".join([*lines, "runtime:", "  binding: none", ""]))
    return path


def test_no_matching_node_and_an_unknown_node_list_the_first_names_and_how_many_more(tmp_path: Path) -> None:
    config = big_config(tmp_path)
    for extra in ((), ("--node", "bogus")):
        proc = invoke("--config", str(config), *extra, "--no-python", "true")
        assert proc.returncode == 2, proc.stderr
        assert max(len(line) for line in proc.stderr.splitlines()) < 400, proc.stderr[:500]
        assert f"... ({10_000 - MAX_LISTED} more)" in proc.stderr and "Traceback" not in proc.stderr


def test_listed_names_everything_when_short() -> None:
    assert listed(["a", "b"]) == "a, b"
    assert listed([str(i) for i in range(MAX_LISTED + 3)]).endswith(", ... (3 more)")
