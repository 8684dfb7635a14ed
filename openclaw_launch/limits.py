"""Every bound on an input, in one place: what a machine can have, with room to spare.

Config loading, snapshots, saved nvidia-smi text, reports and the command line all check against
these, and their messages quote them, so a typo (``0-4000000000``) is a clear error instead of
gigabytes of memory or minutes of CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_CPU_ID = 65535  # CPU and NUMA node ids (Linux's NR_CPUS is at most 8192 today)
MAX_RANKS_PER_NODE = 4096  # --nproc-per-node, cpu_workers, ranks in --console-ranks
MAX_WORLD_SIZE = 1 << 20
MAX_RESTARTS = 1000  # --max-restarts
MAX_SECONDS = 7 * 24 * 3600.0  # every duration option (grace period, backoff, intervals, timeouts)
MIN_HANG_TIMEOUT_S = 2.0  # --hang-timeout-s / runtime.hang_timeout_s: progress is known to ~0.5 s
MIN_AGENT_TIMEOUT_S = 1.0  # --agent-timeout-s: a node's join takes a round trip or two
MIN_KEEPALIVE_S = 0.5  # --keepalive-s: the keep-alive loop beats several times per period
MAX_PERCENT = 1000.0  # --straggler-threshold-pct
MIN_STRAGGLER_INTERVALS = 2  # --straggler-intervals: a node is never excluded on the strength of one interval
MAX_STRAGGLER_INTERVALS = 1000  # --straggler-intervals, --straggler-cooldown-intervals
MAX_ENV_VALUE = 131071  # the kernel's MAX_ARG_STRLEN (128 KiB) less the "\0"
MAX_YAML_DEPTH = 32  # a config is 5 levels deep; nesting deeper is a mistake (or an attack)
MAX_HOST_LEN = 253  # a DNS name
MAX_PREFIX_LEN = 256  # --prefix

# Files read as input: configs and saved command output are kilobytes; a report of many ranks with
# statistics is megabytes.
MAX_CONFIG_BYTES = 4 << 20
MAX_SNAPSHOT_BYTES = 16 << 20
MAX_SMI_BYTES = 4 << 20
MAX_REPORT_BYTES = 64 << 20
MAX_ERROR_FILE_BYTES = 64 << 10  # a worker's @record error file: its prefix is the root cause
MAX_RECORD_BYTES = 1 << 20  # a preflight --record file: a few tiers
FDS_PER_RANK = 2  # the launcher holds per local rank: the read ends of its stdout and stderr
FDS_PER_RANK_LOGS = 2  # ... and with --log-dir its stdout.log and stderr.log
FD_MARGIN = 256  # the launcher's own descriptors besides the ranks' (helpers, logs, sockets, imports)


MAX_LISTED = 12  # names an error message lists (a 10 000-node config's names made one line of 69 000 characters)


def listed(names: Sequence[str], limit: int = MAX_LISTED) -> str:
    """``names`` for an error message, comma-separated, the first ``limit`` and how many more."""
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def seconds_problem(value: float, lo: float = 0.0) -> str | None:
    """Why ``value`` is not a duration from ``lo`` to MAX_SECONDS (None when it is one): the one
    rule for every duration option and config key (nan, inf and 1e300 fail it)."""
    if lo <= value <= MAX_SECONDS:  # false for nan
        return None
    return f"{value!r} is not a number of seconds from {lo:g} to {MAX_SECONDS:g}"


def host_problem(text: str) -> str | None:
    """Why ``text`` is not an IP address or hostname (None when it is one). The one rule for the
    config's ``master_addr``/``ip`` and ``--master-addr``/``--rdzv-endpoint``."""
    import ipaddress
    import re

    try:
        ipaddress.ip_address(text)
        return None
    except ValueError:
        pass
    labels = text.rstrip(".").split(".")
    label_re = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
    numeric = all(label.isdigit() for label in labels)
    if numeric or len(text) > MAX_HOST_LEN or not all(label_re.match(label) for label in labels):
        return f"{text[:80]!r} is neither an IP address nor a valid hostname"
    return None
