"""A burst of new connections to the agents' store, as the job-live helpers of many nodes made one
(issue 29): torch's TCPStore server (its libuv backend) looks up each new client's address by
reverse DNS on its one thread while it accepts it, so a resolver that drops a query stalls the
whole store for its timeout.

The first node's store is hosted here as the launcher's helper hosts it (agents/store.py, the port
bound first, both IPv6 and IPv4); ``--held`` clients connect one after another and stay (the
agents); then ``--burst`` more connect at once from ``--procs`` processes (a thread each), each
trying ``--tries`` times with ``--timeout-s`` a try and a second between tries (the helpers' old
policy: 2 s and a try every interval; the new one: 30 s, once), and writes 7 kB (a node's
summaries). Prints how many connected and in how long, and whether the store still accepts a new
client and answers a held one afterwards. ``--lookups K`` first times K reverse lookups of
``::ffff:10.78.1.x`` (the form the store looks up) on this host's resolver.

    python benchmarks/store_burst.py [--held 128] [--burst 128] [--procs 8] [--timeout-s 2] [--tries 20]
        [--lookups 0]
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from openclaw_launch.agents.store import AgentStore  # noqa: E402
from openclaw_launch.agents.tcpstore_client import TCPStoreClient  # noqa: E402


def lookups(count: int) -> None:
    """Each reverse lookup's time on this host's resolver; those over 0.5 s are listed."""
    slow, started = [], time.monotonic()
    for i in range(count):
        t = time.monotonic()
        socket.getnameinfo((f"::ffff:10.78.1.{i % 200 + 1}", 0, 0, 0), socket.NI_NUMERICSERV)
        if (took := time.monotonic() - t) > 0.5:
            slow.append(f"#{i} {took:.2f} s")
    print(f"{count} lookups in {time.monotonic() - started:.1f} s; over 0.5 s: {', '.join(slow) or 'none'}")


def burst_process(port: int, count: int, timeout_s: float, tries: int) -> None:
    """(A child.) ``count`` threads, each connecting (``tries`` times at most) and writing once;
    prints how many connected and how many tries failed."""
    connected, failed, held = [0], [0], []

    def one(i: int) -> None:
        for _ in range(tries):
            try:
                client = TCPStoreClient("127.0.0.1", port, timedelta(seconds=timeout_s))
                client.set(f"openclaw/live/burst/0/{i}", b"x" * 7000)
                held.append(client)
                connected[0] += 1
                return
            except Exception:
                failed[0] += 1
                time.sleep(1.0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"{connected[0]} {failed[0]}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--held", type=int, default=128)
    p.add_argument("--burst", type=int, default=128)
    p.add_argument("--procs", type=int, default=8)
    p.add_argument("--timeout-s", type=float, default=2.0)
    p.add_argument("--tries", type=int, default=20)
    p.add_argument("--lookups", type=int, default=0)
    p.add_argument("--child", nargs=4, type=float, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        port, count, timeout_s, tries = args.child
        burst_process(int(port), int(count), timeout_s, int(tries))
        return
    if args.lookups:
        lookups(args.lookups)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = AgentStore("127.0.0.1", port, True, 30.0)  # the first node's store, hosted as its helper hosts it
    started = time.monotonic()
    held = [TCPStoreClient("127.0.0.1", port, timedelta(seconds=60)) for _ in range(args.held)]
    print(f"{args.held} held clients connected one after another in {time.monotonic() - started:.1f} s")
    started = time.monotonic()
    each = str(args.burst // args.procs)
    child = [sys.executable, __file__, "--child", str(port), each, str(args.timeout_s), str(args.tries)]
    procs = [subprocess.Popen(child, stdout=subprocess.PIPE, text=True) for _ in range(args.procs)]
    counts = [tuple(int(x) for x in proc.communicate()[0].split()) for proc in procs]
    connected, failed = sum(c[0] for c in counts), sum(c[1] for c in counts)
    print(
        f"burst of {args.burst} ({args.timeout_s:g} s a try, {args.tries} tries): {connected} connected, "
        f"{failed} tries failed, in {time.monotonic() - started:.1f} s"
    )
    try:
        TCPStoreClient("127.0.0.1", port, timedelta(seconds=5)).check(["openclaw/x"])
        accepts = "yes"
    except Exception as exc:
        accepts = f"no ({exc})"
    print(f"a new client within 5 s afterwards: {accepts}; a held client's call: {held[0].add('openclaw/c', 1)}")
    store.set("burst", "done")  # held to the end: the store lives as long as this object


if __name__ == "__main__":
    main()
