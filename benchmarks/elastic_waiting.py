"""The store's load from elastic members that wait (issue 29): a running world of one node
(``--nnodes 1:2``, the last call cut to 1 s) and K standbys (``--standby``) that wait beside it
for the whole run; over ``--window-s``, the requests on every server-side connection of the
agents' port (benchmarks/scale.py's ``store_traffic``: TCP data segments in), then the same with
no standby. The difference over K is one waiting member's requests a second; its CPU (launcher and
agent helper) is the standbys' over the window, over K.

A waiting member's wait is the same code between two worlds (every survivor at a re-forming) as
for a standby; a standby waits long enough to be measured.

    python benchmarks/elastic_waiting.py [--standbys 4] [--window-s 10] [--settle-s 15]

``--tree DIR`` runs another checkout's launcher (``git archive COMMIT | tar -x -C DIR``), for the
before and after of a change.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scale import ROOT, cpu_s, free_port, store_traffic, tree, wait


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def measured(checkout: Path, standbys: int, window_s: float, settle_s: float) -> tuple[float, float]:
    """The store's requests a second while ``standbys`` standbys wait beside a world of one node, and
    the standbys' CPU (launchers and helpers) in % of a core, all together."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="elastic-waiting-") as tmp:
        directory = Path(tmp)
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "SLURM", "TORCHELASTIC"))}
        environ["PYTHONPATH"] = str(checkout)
        line = [sys.executable, "-m", "openclaw_launch", "--nnodes", "1:2", "--nproc-per-node", "1"]
        line += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--max-restarts", "0"]
        line += ["--rdzv-conf", "last_call_timeout=1"]
        worker = [str(checkout / "benchmarks" / "scale_worker.py"), str(directory)]
        procs = []
        try:
            for i, extra in enumerate([[], *[["--standby"]] * standbys]):
                with open(directory / f"launcher-{i}.log", "wb") as log:
                    cmd = [*line, *extra, *worker]
                    procs.append(subprocess.Popen(cmd, cwd=directory, env=environ, stdout=log, stderr=log))
                if i == 0 and not wait(lambda: listening(port), 60):  # the first node hosts: no standby may
                    raise SystemExit("the first node's launcher did not listen within 60 s")
            time.sleep(settle_s)
            waiting = [q for p in procs[1:] for q in tree(p.pid)]
            before, _ = store_traffic(port)
            cpu_before = cpu_s(waiting)
            time.sleep(window_s)
            after, _ = store_traffic(port)
            cpu = (cpu_s(waiting) - cpu_before) / window_s * 100
        finally:
            (directory / "stop").touch()
            for p in procs:
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        codes = sorted({p.returncode for p in procs})
        if codes != [0]:
            raise SystemExit(f"a launcher exited {codes}: see the logs (rerun with fewer standbys?)")
    return (after - before) / window_s, cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--standbys", type=int, default=4)
    p.add_argument("--window-s", type=float, default=10.0)
    p.add_argument("--settle-s", type=float, default=15.0)
    p.add_argument("--tree", type=Path, default=ROOT)
    args = p.parse_args()
    with_them, cpu = measured(args.tree, args.standbys, args.window_s, args.settle_s)
    alone, _ = measured(args.tree, 0, args.window_s, args.settle_s)
    each = (with_them - alone) / max(args.standbys, 1)
    print(
        f"{args.tree}: {with_them:.1f} requests/s with {args.standbys} standbys waiting, {alone:.1f} without: "
        f"{each:.1f} a waiting member; its CPU {cpu / max(args.standbys, 1):.2f} % of a core"
    )


if __name__ == "__main__":
    main()
