"""Network namespaces for benchmarks/scale.py (``--netns-nodes M``): M of the N launchers run in
namespaces of their own host's kernel, each joined to this one by a veth pair, so that their
addresses really differ from the store's (10.78.K.2 against 10.78.1.1) and their traffic crosses
a link, not loopback. Needs root and iproute2's ``ip``.

Namespace K (1..``NAMESPACES``) has ``10.78.K.2/24`` on its end of the pair and a default route to
``10.78.K.1``, this namespace's end; every launcher's endpoint is ``10.78.1.1`` (an address of this
namespace: the store's host is here, by torchrun's c10d rule).
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator

NAMESPACES = 4  # the launchers in namespaces go round-robin over these
ENDPOINT = "10.78.1.1"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def namespaces(wanted: bool) -> Iterator[list[str]]:
    """The namespaces' names (none when not ``wanted``), removed at the end with their links."""
    if not wanted:
        yield []
        return
    tag = uuid.uuid4().hex[:5]
    names: list[str] = []
    try:
        for k in range(1, NAMESPACES + 1):
            ns, here, there = f"ocs{k}-{tag}", f"vs{k}-{tag}", f"vn{k}-{tag}"
            ip("netns", "add", ns)
            names.append(ns)
            ip("link", "add", here, "type", "veth", "peer", "name", there, "netns", ns)
            ip("addr", "add", f"10.78.{k}.1/24", "dev", here)
            ip("link", "set", here, "up")
            ip("-n", ns, "addr", "add", f"10.78.{k}.2/24", "dev", there)
            ip("-n", ns, "link", "set", there, "up")
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "route", "add", "default", "via", f"10.78.{k}.1")
        yield names
    finally:
        for ns in names:  # a namespace's end of a veth goes with it, and the pair with that end
            with contextlib.suppress(subprocess.SubprocessError):
                ip("netns", "del", ns)


def inside(ns: str | None, command: list[str]) -> list[str]:
    """``command`` run in namespace ``ns`` (``ip netns exec`` execs it: the pid is the command's)."""
    return command if ns is None else ["ip", "netns", "exec", ns, *command]
