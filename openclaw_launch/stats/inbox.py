"""The launcher's end of the statistics channel: a Unix datagram socket in the private run dir."""

from __future__ import annotations

import contextlib
import os
import socket

_RECEIVE_BUFFER_BYTES = 4 << 20  # room for every rank's batches while the loop is busy elsewhere
_MAX_PER_DRAIN = 1024  # datagrams read per wake-up, so output and exits are never starved


class Inbox:
    def __init__(self, path: str) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            with contextlib.suppress(OSError):  # capped by net.core.rmem_max: best effort
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RECEIVE_BUFFER_BYTES)
            self._sock.bind(path)
            self._sock.setblocking(False)
        except BaseException:
            self._sock.close()
            raise

    def fileno(self) -> int:
        return self._sock.fileno()

    def receive(self) -> list[bytes]:
        """What is queued now, without blocking."""
        out: list[bytes] = []
        while len(out) < _MAX_PER_DRAIN:
            try:
                out.append(self._sock.recv(1 << 16))
            except (BlockingIOError, InterruptedError):
                break
        return out

    def close(self) -> None:
        self._sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
