"""RealOs against the real /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
from guards import wait_for

from openclaw_launch.run.osproc import RealOs

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
        wait_for(lambda: all(psutil.Process(p.pid).children() for p in (exempt, other)), "the trees did not start")
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


def test_nested_signal_installs_keep_an_early_signal_and_restore_at_the_outermost() -> None:
    """launch() catches signals for its whole run; supervise() nests inside and sees what came first."""
    os_layer = RealOs()
    outer_fd = os_layer.install_signals([signal.SIGUSR1])
    try:
        os.kill(os.getpid(), signal.SIGUSR1)  # e.g. while the MPS daemon starts
        inner_fd = os_layer.install_signals([signal.SIGUSR1, signal.SIGCHLD])
        assert inner_fd == outer_fd
        assert signal.SIGUSR1 in os_layer.drain_signals()
        os_layer.restore_signals()  # supervise() ends: still caught (MPS stop, report)
        assert signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, signal.SIG_IGN)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert signal.SIGUSR1 in os_layer.drain_signals()
    finally:
        os_layer.restore_signals()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGCHLD) is signal.SIG_DFL
    assert signal.set_wakeup_fd(-1) == -1
