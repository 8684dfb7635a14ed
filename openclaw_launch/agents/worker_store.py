"""torchrun's agent store for the workers: node rank 0's launcher hosts the job's TCPStore at
MASTER_ADDR:MASTER_PORT for the job's life, and every rank is told so
(``TORCHELASTIC_USE_AGENT_STORE=True``, plan/env.py). ``init_process_group("env://")`` (and
``tcp://``) then opens the store as a client on every rank, as under torchrun
(torch/distributed/rendezvous.py, ``_create_c10d_store``), and a tool that joins the agent's store
before any process group exists (torchft's Manager: ``TCPStore(MASTER_ADDR, MASTER_PORT,
is_master=False)``) finds it there instead of waiting for a rank that would make it.

A fresh store for each attempt, at the same address: torch <= 2.0's rendezvous put every worker key
under ``/worker/attempt_N`` (TORCHELASTIC_RESTART_COUNT); torch 2.13's puts none ("we create a new
TCPStore for every retry so no need to add prefix for each attempt", rendezvous.py), while torchrun
2.13 keeps one server for the job, so an attempt's ranks read the keys the ranks before them left:
gloo's full mesh then dials a dead rank's address (``connectFullMesh ... Connection refused``), in 4
of 6 restarts of tests/agent_store_worker.py under torchrun on the 2-core test box. Here the store
ends with its attempt (``end_attempt``: the workers are gone, and with agents every node is done
with it) and the next attempt's ranks find an empty one: the old prefix's promise, without it. The
helper that made a store stays for the job (torch imported once) and makes each attempt's fresh
store on the same listening socket; one that made none ends with the attempt. An
elastic world's store is its node rank 0's, at that world's MASTER_PORT: ``begin_ranks`` follows
the ranks of each attempt, whose environment is the plan's.

Where it runs: the launcher binds and listens on the port itself (an error there is one line, exit
2, before any worker starts), then forks a helper (run/helper.py: the launcher keeps one thread at
fork) that holds the listening socket and makes the store on it (``TCPStore(...,
master_listen_fd=...)``, which accepts what waits in the backlog). When it imports torch: at once
where the node's ranks are GPU ranks running a Python target (such a node has cores to spare: the
import runs beside the workers' own) and for a restart whose attempt before opened the store (issue 33,
benchmarks/restart_breakdown.py); else when the first connection is waiting, so a job whose
workers never open the store pays nothing for it, and one that does waits about 1 s for the
helper's import after its ranks' own (2-core test box, warm cache). torch is the launcher's (its
Python's); without it the store cannot be hosted, and the helper says so once.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from openclaw_launch.agents.store import listen_on
from openclaw_launch.errors import LaunchError
from openclaw_launch.plan.build import BOOTSTRAP_MODULE
from openclaw_launch.plan.env import agent_store_endpoint
from openclaw_launch.run.helper import Helper, Link, Message, Vocabulary
from openclaw_launch.run.participant import Participant, StopKind, StopReason, Timer

if TYPE_CHECKING:
    from openclaw_launch.plan.model import RankPlan

_POLL_S = 0.5  # how often the launcher reads what the helper said (while an attempt is open)


class WorkerStoreError(LaunchError):
    """The workers' store cannot listen at MASTER_PORT: nothing was started (exit 2)."""


@dataclass(frozen=True)
class StoreUp(Message):
    """The helper made the store (torch imported): it answers the workers from now on."""

    port: int


@dataclass(frozen=True)
class StoreFailed(Message):
    """The helper could not make the store (no torch in the launcher's Python, c10d refused)."""

    text: str


@dataclass(frozen=True)
class Renew(Message):
    """The attempt is over: drop its store, make a fresh one on the same listening socket."""


VOCABULARY = Vocabulary(to_helper=(Renew,), to_launcher=(StoreUp, StoreFailed))


def listen(port: int) -> socket.socket:
    """A socket listening on MASTER_PORT (agents/store.py's ``listen_on``: every address, SO_REUSEADDR
    as TCPStore's); a port in use is one line, exit 2."""
    try:
        return listen_on(port)
    except OSError as e:
        taken = " (in use: another job or process listens there)" if e.errno == errno.EADDRINUSE else ""
        raise WorkerStoreError(
            f"cannot host the workers' store at MASTER_PORT {port}{taken}: {e.strerror or e}; "
            "give another --master-port (0: a free one, one node only); started nothing"
        ) from None


def _serve(link: Link, listener: socket.socket, port: int, eager: bool = False) -> None:
    """The helper: wait for the first connection (or the launcher's end), then make the store on the
    listening socket and hold it until the launcher ends the link; at each ``Renew`` the store goes
    and a fresh one takes its place on the same socket (what connects meanwhile waits in its
    backlog). ``eager``: make the first at once (the attempt before used its store: this one's is
    ready before its workers reach it)."""
    while not eager and not link.closed:
        readable, _, _ = select.select([link.fileno(), listener.fileno()], [], [])
        if listener.fileno() in readable:
            break
        link.wait(0)  # EOF: the launcher ended the job before any worker came
    store = _make_store(link, listener, port)
    while store is not None and not link.closed:
        if any(isinstance(message, Renew) for message in link.wait(None)):
            store = None  # first: the attempt before's keys never reach the next one's ranks
            store = _make_store(link, listener, port)
    while not link.closed:
        link.wait(None)


def _make_store(link: Link, listener: socket.socket, port: int) -> object | None:
    """A TCPStore on (a copy of) the listening socket, said to the launcher; None when it cannot be
    made (said too, and the socket closed: the workers' connects are refused and retried rather than
    left unanswered)."""
    if link.closed:
        return None
    try:
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # this process's: c10d's connect warnings
        from torch.distributed import TCPStore

        loopback = "::1" if listener.family == socket.AF_INET6 and not _dual_stack(listener) else "127.0.0.1"
        listen_fd = os.dup(listener.fileno())  # the store closes it when it goes; the socket stays
        store = TCPStore(loopback, port, None, True, wait_for_workers=False, master_listen_fd=listen_fd)
    except Exception as e:  # ImportError (no torch here), c10d's own errors: one line for the launcher
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        link.send(StoreFailed(f"{type(e).__name__}: {first}"))
        listener.close()
        return None
    link.send(StoreUp(port))
    return store


def _dual_stack(sock: socket.socket) -> bool:
    with contextlib.suppress(OSError):
        return sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0
    return False


def _python_on_gpus(ranks: Sequence[RankPlan]) -> bool:
    """GPU ranks running a Python target (through the statistics bootstrap): a training script that
    will open the store, on a node with cores to spare for the helper's import beside theirs. A
    ``--no-python`` command, or a CPU rank, makes the store at its first connection."""
    return any(r.gpu_uuid is not None and BOOTSTRAP_MODULE in r.argv for r in ranks)


class WorkerStore(Participant):
    """The launcher's side: hosts a store for the ranks of each attempt where they say this node is
    the host (plan/env.py's ``agent_store_endpoint``), and ends it with the attempt."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say
        self._helper: Helper | None = None
        self._port: int | None = None
        self._failed: StopReason | None = None
        self._said_failed = False
        self._used = False  # an attempt's workers opened the store (the helper made it)

    @property
    def port(self) -> int | None:
        """Where this node hosts the store now; None: it hosts none."""
        return self._port

    @property
    def pid(self) -> int | None:
        return self._helper.pid if self._helper is not None else None

    def host(self, ranks: Sequence[RankPlan], eager: bool = False) -> None:
        """Host the store these ranks are told of (nothing if another node hosts it, or none is
        used); ``WorkerStoreError`` if the port cannot be listened on. ``eager``: torch imported and
        the store made at once, not at the first connection."""
        port = agent_store_endpoint(ranks[0].env) if ranks else None
        eager = eager or _python_on_gpus(ranks)
        if port == self._port:
            return
        self.close()
        if port is None:
            return
        listener = listen(port)
        try:
            self._helper = Helper.fork(
                "openclaw-store",
                lambda link: _serve(link, listener, port, eager),
                VOCABULARY,
                keep_fds=(listener.fileno(),),
            )
        finally:
            listener.close()  # the helper's now
        self._port = port

    def begin_ranks(self, attempt: int, ranks: tuple[RankPlan, ...]) -> None:
        """A re-formed world may have another host or port (an elastic job): follow it. A port that
        cannot be listened on stops this attempt (its workers could not meet)."""
        self._failed = None
        try:  # a restart whose workers used the store: it is ready before they come (issue 33)
            self.host(ranks, eager=attempt > 0 and self._used)
        except WorkerStoreError as e:
            self._failed = StopReason(StopKind.FAILURE, 1, str(e).replace("; started nothing", ""), False)

    def end_attempt(self, attempt: int) -> None:
        """The attempt's workers are gone: its store goes with them (the next attempt's is new). A
        helper that made one keeps its torch and makes the next at once (a restart's workers, forked
        from a --prewarm zygote, would otherwise wait for the helper's import); else it ends."""
        self._read()  # whether they opened it: then the next attempt's is made before its workers start
        if self._helper is not None and self._used and not self._said_failed and self._helper.link.send(Renew()):
            return
        self.close()

    def stop_reason(self) -> StopReason | None:
        return self._failed

    def timers(self) -> Sequence[Timer]:
        return ((_POLL_S, self._read),)

    def _read(self) -> None:
        if self._helper is None:
            return
        for message in self._helper.link.receive():
            self._used = self._used or isinstance(message, StoreUp)
            if isinstance(message, StoreFailed) and not self._said_failed:
                self._said_failed = True
                self._say(
                    f"openclaw-launch: warning: the workers' store at MASTER_PORT {self._port} could not be made "
                    f"({message.text}); ranks that open it (init_process_group, TORCHELASTIC_USE_AGENT_STORE=True) "
                    "will wait for it; torch must be importable by the launcher's Python, or set "
                    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 to let rank 0 host it"
                )

    def close(self) -> None:
        """End the store now: the helper holds nothing worth waiting for (and may be in torch's
        import, which would not look at the link for seconds)."""
        if self._helper is not None:
            self._helper.end(0)
        self._helper, self._port = None, None
