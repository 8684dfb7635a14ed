"""The launcher's own lighthouse for ``--replica-groups`` (``--lighthouse openclaw``): torchft's
lighthouse gRPC service (run/lighthouse_proto.py) with torchft's quorum rule
(run/lighthouse_quorum.py), which the launcher can tell that a replica group is gone.

Run as ``python -m openclaw_launch.run.lighthouse_server`` with torchft_lighthouse's options; the
launcher spawns it as it would torchft's (job/lighthouse.py: its own session, SIGKILL when the
launcher dies). It is a process of its own because gRPC runs threads and the launcher forks with one.

Notices: ``OPENCLAW_LIGHTHOUSE_NOTICES`` (plan/replica_groups.py) names a FIFO that the launcher of
the groups made and keeps open for writing (job/replica_groups.py); each group launcher writes
``gone PORT`` there, PORT its store port (``MASTER_PORT``), the moment its supervisor stops an
attempt for a failure and when an attempt ends. Each notice drops that group's replicas and looks for a quorum at once.

Threads: gRPC's pool serves the RPCs (a ``Quorum`` call waits in it until its quorum forms, as
torchft's does), one thread ticks every ``--quorum_tick_ms`` while participants wait, one reads the
notices; one lock (a condition) guards the state, and each formed quorum wakes the waiting calls.
Its log (stderr) says each quorum request, each change of the quorum's status, each new quorum and
each notice, one line each, stamped in local time as torchft's are.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import threading
import time
from concurrent import futures
from datetime import datetime
from typing import Any

import grpc

from openclaw_launch.config.defaults import LIGHTHOUSE_START_TIMEOUT_MS
from openclaw_launch.plan.replica_groups import LIGHTHOUSE_NOTICES_ENV
from openclaw_launch.run import lighthouse_proto as pb
from openclaw_launch.run.lighthouse_quorum import QuorumSettings, QuorumState

_HISTORY = 16  # quorums a waiting call can still find (torchft's broadcast channel holds 16)
_RPC_THREADS = 64  # each replica group's Manager holds one for its waiting quorum request, beside heartbeats


def log(message: str) -> None:
    """One line on stderr in one write (``print`` writes the line and its end apart: threads interleave)."""
    os.write(2, f"{datetime.now().isoformat(timespec='microseconds')} INFO {message}\n".encode(errors="replace"))


class Lighthouse:
    """The state under one condition; formed quorums kept by sequence number for the waiting calls."""

    def __init__(self, settings: QuorumSettings, tick_s: float) -> None:
        self.state = QuorumState(settings)
        self.tick_s = tick_s
        self.changed = threading.Condition()
        self.formed: collections.deque[tuple[int, Any]] = collections.deque(maxlen=_HISTORY)
        self.sequence = 0
        self._reason = ""

    def _tick(self) -> None:
        """Under the lock: a quorum that can form is formed and published to the waiting calls. A
        reason to wait is logged when it differs from the last one, a quorum when its id changed."""
        previous_id = self.state.quorum_id
        formed, reason = self.state.tick(time.monotonic())
        if formed is None:
            if reason != self._reason:
                log(f"Quorum status: {reason}")
            self._reason = reason
            return
        quorum = pb.Quorum(quorum_id=formed.quorum_id, participants=list(formed.members))
        quorum.created.GetCurrentTime()
        self.sequence += 1
        self.formed.append((self.sequence, quorum))
        self.changed.notify_all()
        if formed.quorum_id != previous_id:
            ids = ", ".join(m.replica_id for m in formed.members)
            log(f"Detected quorum change, bumping quorum_id to {formed.quorum_id} ({reason}): Quorum! [{ids}]")

    def quorum(self, request: Any, context: grpc.ServicerContext) -> Any:
        if not request.HasField("requester"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "missing requester")
        member = request.requester
        with self.changed:
            if not self.state.join(member, time.monotonic()):
                context.abort(grpc.StatusCode.UNAVAILABLE, f"replica {member.replica_id}: its group is gone")
            log(f"Received quorum request for replica {member.replica_id}")  # torchft's line; said once joined
            seen = self.sequence
            self._tick()
            while context.is_active():
                for sequence, quorum in list(self.formed):
                    if sequence <= seen:
                        continue
                    if any(p.replica_id == member.replica_id for p in quorum.participants):
                        return pb.LighthouseQuorumResponse(quorum=quorum)
                    seen = sequence  # a quorum without it: it asks again (torchft re-inserts it)
                    if not self.state.join(member, time.monotonic()):
                        break
                if member.replica_id in self.state.gone:
                    context.abort(grpc.StatusCode.UNAVAILABLE, f"replica {member.replica_id}: its group is gone")
                self.changed.wait(self.tick_s)
        return pb.LighthouseQuorumResponse()  # the caller went away (its timeout): nobody reads this

    def heartbeat(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.changed:
            self.state.heartbeat(request.replica_id, time.monotonic())
        return pb.LighthouseHeartbeatResponse()

    def gone(self, port: str) -> None:
        with self.changed:
            removed = self.state.group_gone(port)
            if removed:  # a group's notices come twice or thrice (job/replica_groups.py): the first says it
                log(f"group with store port {port} gone: removed replica(s) [{', '.join(removed)}]")
            self._tick()
            self.changed.notify_all()  # the gone replicas' own waiting calls end

    def run_ticks(self) -> None:
        while True:
            time.sleep(self.tick_s)
            with self.changed:
                if self.state.participants:
                    self._tick()

    def read_notices(self, path: str) -> None:
        """``gone PORT`` lines from the FIFO, until it ends (the launcher is gone: so is this process)."""
        with open(path, "rb", buffering=0) as fifo:
            for line in fifo:
                words = line.decode(errors="replace").split()
                if len(words) == 2 and words[0] == "gone":
                    self.gone(words[1])
                else:
                    log(f"unknown notice {line!r}: ignored")


def serve(bind: str, lighthouse: Lighthouse, notices: str | None) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=_RPC_THREADS), options=[("grpc.so_reuseport", 0)])
    handlers = {
        "Quorum": grpc.unary_unary_rpc_method_handler(
            lighthouse.quorum,
            request_deserializer=pb.LighthouseQuorumRequest.FromString,
            response_serializer=pb.LighthouseQuorumResponse.SerializeToString,
        ),
        "Heartbeat": grpc.unary_unary_rpc_method_handler(
            lighthouse.heartbeat,
            request_deserializer=pb.LighthouseHeartbeatRequest.FromString,
            response_serializer=pb.LighthouseHeartbeatResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(pb.SERVICE, handlers),))
    try:
        port = server.add_insecure_port(bind)  # 0 where it cannot bind (older grpcio), else it raises
    except RuntimeError as e:
        port, why = 0, f": {e}"
    else:
        why = ""
    if not port:
        log(f"cannot bind {bind}{why}")  # the launcher says its last lines and stops the groups
        sys.exit(1)
    server.start()
    threading.Thread(target=lighthouse.run_ticks, name="quorum-tick", daemon=True).start()
    if notices:
        threading.Thread(target=lighthouse.read_notices, args=(notices,), name="notices", daemon=True).start()
    log(f"Lighthouse listening on: {bind} (port {port})")
    server.wait_for_termination()


def main(argv: list[str] | None = None) -> None:
    """torchft_lighthouse's options (``--bind``, ``--min_replicas``, ``--join_timeout_ms``,
    ``--quorum_tick_ms``, ``--heartbeat_timeout_ms``), with its defaults, and this lighthouse's own
    ``--expected_replicas`` and ``--start_timeout_ms`` (the first quorum's wait, run/lighthouse_quorum.py)."""
    parser = argparse.ArgumentParser(prog="python -m openclaw_launch.run.lighthouse_server", description=__doc__)
    parser.add_argument("--bind", default="[::]:29510")
    parser.add_argument("--min_replicas", type=int, required=True)
    parser.add_argument("--join_timeout_ms", type=int, default=60000)
    parser.add_argument("--quorum_tick_ms", type=int, default=100)
    parser.add_argument("--heartbeat_timeout_ms", type=int, default=5000)
    parser.add_argument("--expected_replicas", type=int, default=0, help="0: torchft's rule from the start")
    parser.add_argument("--start_timeout_ms", type=int, default=LIGHTHOUSE_START_TIMEOUT_MS)
    args = parser.parse_args(argv)
    settings = QuorumSettings(
        args.min_replicas,
        args.join_timeout_ms / 1000,
        args.heartbeat_timeout_ms / 1000,
        args.expected_replicas,
        args.start_timeout_ms / 1000,
    )
    serve(args.bind, Lighthouse(settings, args.quorum_tick_ms / 1000), os.environ.get(LIGHTHOUSE_NOTICES_ENV))


if __name__ == "__main__":
    main()
