"""What one TCPStore serves (issue 29's model past this machine): torch's TCPStore server in a
process of its own, as the first node's agent helper hosts it, and K client processes of the
standard-library client (agents/tcpstore_client.py, as every other node's agent) each making the
agents' running calls in a loop: a ``check`` of the fate key, and every 7th call an ``add`` (a beat
or a read of node 0's counter). Then one client reads N counters with ``multi_get`` (node 0's read
a beat) R times.

Reported: the server's CPU per request (its process's user+system time over the requests it
answered), the rate reached (on this machine the clients' Python is the bound, not the server), and
the server's CPU per counter of a ``multi_get``. One core of the server serves about
1 / (CPU per request) requests a second.

    python benchmarks/store_capacity.py [--clients 4] [--calls 20000] [--counters 1024] [--reads 200]
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openclaw_launch.agents.tcpstore_client import TCPStoreClient  # noqa: E402


def serve(port: int, ready: multiprocessing.synchronize.Event, stop: multiprocessing.synchronize.Event) -> None:
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", port, None, True, timeout=timedelta(seconds=60), wait_for_workers=False)
    store.set("openclaw/hb/0", "0")
    ready.set()
    stop.wait()


def client(port: int, calls: int, rank: int) -> None:
    store = TCPStoreClient("127.0.0.1", port, timedelta(seconds=60))
    fate = ["openclaw/fate/0"]
    for i in range(calls):
        if i % 7 == 0:
            store.add(f"openclaw/hb/{rank + 1}", 1)
        else:
            store.check(fate)
    store.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--counters", type=int, default=1024)
    p.add_argument("--reads", type=int, default=200)
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    ready, stop = multiprocessing.Event(), multiprocessing.Event()
    server = multiprocessing.Process(target=serve, args=(port, ready, stop))
    server.start()
    ready.wait(120)
    served = psutil.Process(server.pid)

    def cpu_s() -> float:
        t = served.cpu_times()
        return t.user + t.system

    before, start = cpu_s(), time.monotonic()
    workers = [multiprocessing.Process(target=client, args=(port, args.calls, k)) for k in range(args.clients)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    took, used = time.monotonic() - start, cpu_s() - before
    requests = args.clients * args.calls
    print(f"{requests} requests from {args.clients} clients in {took:.2f} s: {requests / took:.0f} req/s reached")
    print(f"server CPU {used:.2f} s: {1e6 * used / requests:.1f} us per request")
    reader = TCPStoreClient("127.0.0.1", port, timedelta(seconds=60))
    keys = [f"openclaw/hb/c{k}" for k in range(args.counters)]
    for k in keys:
        reader.add(k, 1)
    before, start = cpu_s(), time.monotonic()
    for _ in range(args.reads):
        reader.multi_get(keys)
    took, used = time.monotonic() - start, cpu_s() - before
    per_read = 1e3 * took / args.reads
    print(f"multi_get of {args.counters} counters: {per_read:.2f} ms a read (client and server)")
    print(f"  server CPU {1e6 * used / args.reads / args.counters:.2f} us per counter")
    reader.close()
    stop.set()
    server.join()


if __name__ == "__main__":
    main()
