"""The launcher's end of the statistics channel: one abstract Unix datagram socket per local rank.

The channel is untrusted input. A datagram counts only when the kernel says (``SCM_CREDENTIALS``)
that it comes from the very process the launcher spawned for that rank: not a forked child (which
must not report steps or ``final`` as the rank), not another rank, not a process outside the job.
Each rank has its own socket, so a rank flooding it fills only its own kernel queue, and a token
bucket per rank bounds what the launcher decodes; everything dropped is counted per rank.

The kernel lets a process with CAP_SYS_ADMIN over the sender's PID namespace (root, or a
container's root given that capability) put any pid in those credentials. So every datagram also
starts with the run's token (``wire.TOKEN_ENV``, 128 random bits the launcher hands its ranks in
their environment, ``RunDir.token``): a forger must also read a rank's environment, which the
kernel allows only to the rank's own user or with CAP_SYS_PTRACE. Not defended: such a process
(root on the host is one) can read the token, or act as the rank in any other way (ptrace it, kill
it, or the launcher). Both checks hold every datagram; a failed one is counted as not the rank's.
The socket's name holds a random nonce (``telemetry_socket_name``), so no one can bind it first.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING

from openclaw_launch.errors import LaunchError
from openclaw_launch.telemetry import wire

if TYPE_CHECKING:
    from openclaw_launch.stats.result import DroppedDatagrams

_RECEIVE_BUFFER_BYTES = 1 << 20  # per rank; capped by net.core.rmem_max: best effort
_MAX_PER_DRAIN = 64  # datagrams read per socket per wake-up: every rank's socket gets its turn
_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid
# A rank may send RATE_PER_S datagrams a second (one per 4 KiB begun), BURST at once: a real one
# sends a few a second (telemetry/recorder.py: a batch every 0.5 s or 200 steps, progress on change).
RATE_PER_S = 200.0
BURST = 400.0
_COST_BYTES = 4096  # a datagram counts one per this many bytes


class _RankSocket:
    def __init__(self, rank: int, address: str) -> None:
        self.rank = rank
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.pid: int | None = None  # the process the launcher spawned for the rank (this attempt)
        self.tokens = BURST
        self.refilled_s = 0.0
        # datagrams not taken, by why (DroppedDatagrams' fields, built at the end: ``Inbox.drops``)
        self.invalid = self.not_rank_process = self.over_rate = 0
        self.strangers: set[int] = set()  # pids already warned about
        try:
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RECEIVE_BUFFER_BYTES)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            self.sock.bind(address)
            self.sock.setblocking(False)
        except OSError as exc:
            self.sock.close()
            shown = "@" + address[1:] if address.startswith("\0") else address
            raise LaunchError(
                f"cannot open the statistics socket {shown} for rank {rank}: {exc.strerror or exc}"
                + (
                    " (taken by another process: the name's nonce is new at every start, so start again)"
                    if exc.errno == errno.EADDRINUSE
                    else ""
                )
                + "; or pass --telemetry off"
            ) from None

    def take(self, cost: float, now_s: float) -> bool:
        self.tokens = min(BURST, self.tokens + (now_s - self.refilled_s) * RATE_PER_S)
        self.refilled_s = now_s
        if self.tokens < cost:
            return False
        self.tokens -= cost
        return True


class Inbox:
    """Every local rank's socket (``wire.rank_address``); ``receive`` gives the datagrams that came
    from each rank's own process, within its rate, and counts the rest in ``drops``. ``ranks``:
    (local rank, global rank) pairs; ``token``: what every datagram starts with. ``assign`` follows
    an elastic job's new world, whose global ranks differ while the sockets (by local rank) stay."""

    def __init__(self, socket_env: str, ranks: Iterable[tuple[int, int]], token: str) -> None:
        self.socket_env = socket_env
        self._token = token.encode()  # every datagram's first bytes (``RunDir.token``)
        self._slots: dict[int, _RankSocket] = {}  # local rank -> its socket
        try:
            for local_rank, rank in ranks:
                self._slots[local_rank] = _RankSocket(rank, wire.rank_address(socket_env, local_rank))
        except BaseException:
            self.close()
            raise
        self._socks = {s.rank: s for s in self._slots.values()}  # global rank -> its socket
        self._by_fd = {s.sock.fileno(): s for s in self._slots.values()}
        self.warn: list[str] = []  # what the console is told once per sender (taken by the session)

    def filenos(self) -> list[int]:
        return list(self._by_fd)

    def spawned(self, rank: int, pid: int) -> None:
        """The supervisor started ``pid`` as ``rank``: from now on only it speaks for the rank."""
        if rank in self._socks:
            self._socks[rank].pid = pid

    def forget_pids(self) -> None:
        """A new attempt: the previous attempt's processes speak for nobody."""
        for s in self._slots.values():
            s.pid = None

    def assign(self, ranks: Iterable[tuple[int, int]]) -> None:
        """The attempt's (local rank, global rank) pairs: a socket answers for its local rank's new
        global rank (a local rank the plan never had gets no socket: it cannot be asked for)."""
        for local_rank, rank in ranks:
            if local_rank in self._slots:
                self._slots[local_rank].rank = rank
        self._socks = {s.rank: s for s in self._slots.values()}

    def drops(self) -> dict[int, DroppedDatagrams]:
        """Per rank with any, its datagrams not taken and why (at the end: the report's type is not
        the start path's import)."""
        from openclaw_launch.stats.result import DroppedDatagrams

        found = {
            rank: DroppedDatagrams(invalid=s.invalid, not_rank_process=s.not_rank_process, over_rate=s.over_rate)
            for rank, s in sorted(self._socks.items())
        }
        return {rank: d for rank, d in found.items() if d.total}

    def receive(self, fd: int, now_s: float) -> list[tuple[int, bytes]]:
        """(rank, datagram) for what rank's socket ``fd`` holds now, without blocking."""
        s = self._by_fd[fd]
        out: list[tuple[int, bytes]] = []
        for _ in range(_MAX_PER_DRAIN):
            try:
                size = len(self._token) + wire.MAX_DATAGRAM_BYTES + 1
                data, anc, _flags, _addr = s.sock.recvmsg(size, socket.CMSG_SPACE(12))
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # a pending socket error, read (and cleared) by this call: the channel goes on
                break
            pid = _sender_pid(anc)
            if pid is None or pid != s.pid:
                s.not_rank_process += 1
                self._stranger(
                    s,
                    pid,
                    f"rank {s.rank}: statistics from pid {pid} ignored: only the rank's own process "
                    f"(pid {s.pid}, the one the launcher started) reports for it, not its children "
                    "(a --no-python wrapper must exec the program) nor another process",
                )
            elif not data.startswith(self._token):
                s.not_rank_process += 1
                self._stranger(
                    s,
                    pid,
                    f"rank {s.rank}: statistics in the name of pid {pid} (the rank) without the run's token "
                    f"({wire.TOKEN_ENV}) ignored: forged credentials, or a rank that changed its environment",
                )
            elif not s.take(max(1.0, len(data) / _COST_BYTES), now_s):
                s.over_rate += 1
            else:
                out.append((s.rank, data[len(self._token) :]))
        return out

    def _stranger(self, s: _RankSocket, pid: int | None, text: str) -> None:
        """Say ``text`` once per sender, for at most 8 senders per rank."""
        if pid is not None and pid not in s.strangers and len(s.strangers) < 8:
            s.strangers.add(pid)
            self.warn.append(text)

    def invalid(self, rank: int) -> None:
        self._socks[rank].invalid += 1

    def close(self) -> None:
        """Idempotent: an abstract socket leaves no file behind."""
        for s in self._slots.values():
            s.sock.close()


def _sender_pid(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= _CREDENTIALS.size:
            pid = int(_CREDENTIALS.unpack_from(data)[0])
            return pid if pid > 0 else None
    return None
