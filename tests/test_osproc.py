"""RealOs against the real /proc."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from openclaw_launch.osproc import RealOs

TREE = (  # a parent that sleeps beside its own sleeping child
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"
)


def test_descendants_leave_out_exempt_subtrees() -> None:
    """What the MPS control daemon starts (its servers) is spared with it at leftover time."""
    os_layer = RealOs()
    exempt = subprocess.Popen([sys.executable, "-c", TREE])
    other = subprocess.Popen([sys.executable, "-c", TREE])
    try:
        deadline = time.monotonic() + 20
        while not all(psutil.Process(p.pid).children() for p in (exempt, other)):
            assert time.monotonic() < deadline, "the process trees did not start"
            time.sleep(0.02)
        (exempt_child,) = psutil.Process(exempt.pid).children()
        (other_child,) = psutil.Process(other.pid).children()
        everything = set(os_layer.descendants())
        assert {exempt.pid, exempt_child.pid, other.pid, other_child.pid} <= everything
        spared = set(os_layer.descendants(exempt=[exempt.pid]))
        assert {other.pid, other_child.pid} <= spared
        assert not {exempt.pid, exempt_child.pid} & spared
    finally:
        for p in (exempt, other):
            subprocess.run(["pkill", "-KILL", "-P", str(p.pid)], check=False)
            p.kill()
            p.wait()
