"""``LOGLEVEL`` for the launcher's own log, as torchrun reads it (``torch.distributed.elastic``'s
loggers take ``LOGLEVEL``; torchtitan's and pytorch/examples' Slurm scripts export ``LOGLEVEL=INFO``).

At ``INFO`` (or ``DEBUG``, or a number up to 20) the launcher says what torchrun's agent logs at
INFO: each attempt's rendezvous result (restart count, MASTER_ADDR:MASTER_PORT, node rank of the
node count, local and global ranks, world size, who hosts the workers' store), each worker's pid as
it starts, why the node stops and each attempt's end. The default, ``WARNING``, and above add
nothing: the launcher's warnings are about the job and are always printed. A value that is no log
level is refused (exit 2) where torchrun stops with a traceback (``Unknown level``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from openclaw_launch.errors import OpenclawError
from openclaw_launch.plan.env import agent_store_endpoint
from openclaw_launch.plan.model import RankPlan
from openclaw_launch.run.participant import Participant, StopReason

LEVELS = {"CRITICAL": 50, "FATAL": 50, "ERROR": 40, "WARN": 30, "WARNING": 30, "INFO": 20, "DEBUG": 10, "NOTSET": 0}
INFO = LEVELS["INFO"]
DEFAULT = LEVELS["WARNING"]  # torchrun's default (torch.distributed.elastic.utils.logging)


class LogLevelError(OpenclawError):
    """``LOGLEVEL`` is no log level (exit 2, nothing started)."""


def log_level(environ: Mapping[str, str]) -> int:
    """``LOGLEVEL`` as a number: a level name (any case) or a number; unset or empty: WARNING."""
    text = environ.get("LOGLEVEL", "").strip()
    if not text:
        return DEFAULT
    if text.isdigit():
        return int(text)
    if text.upper() in LEVELS:
        return LEVELS[text.upper()]
    raise LogLevelError(
        f"LOGLEVEL={text[:40]!r} is no log level: give DEBUG, INFO, WARNING, ERROR or CRITICAL (or a number)"
    )


class InfoLog(Participant):
    """The launcher's INFO lines, as supervision goes (``say``: the launcher's stderr)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say

    def _info(self, text: str) -> None:
        self._say(f"openclaw-launch: info: {text}")

    def begin_ranks(self, attempt: int, ranks: tuple[RankPlan, ...]) -> None:
        if not ranks:
            return
        env = ranks[0].env
        host = "this node" if agent_store_endpoint(env) is not None else "node rank 0"
        store = f"hosted by {host}" if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True" else "made by rank 0"
        self._info(
            f"attempt {attempt}: rendezvous complete: restart_count={attempt} "
            f"master_addr={env.get('MASTER_ADDR')} master_port={env.get('MASTER_PORT')} "
            f"group_rank={ranks[0].node_rank} group_world_size={env.get('GROUP_WORLD_SIZE')} "
            f"local_ranks={[r.local_rank for r in ranks]} global_ranks={[r.rank for r in ranks]} "
            f"world_size={env.get('WORLD_SIZE')}; the workers' store is {store}"
        )

    def on_spawn(self, rank: int, pid: int) -> None:
        self._info(f"rank {rank} started: pid {pid}")

    def on_stop(self, reason: StopReason) -> None:
        self._info(f"this node stops: {reason.headline}")

    def end_attempt(self, attempt: int) -> None:
        self._info(f"attempt {attempt}: every worker of this node is gone")
