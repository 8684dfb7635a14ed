"""Every default of the launcher's options, defined once.

The click options, the option dataclasses of the supervisor, the statistics and the agents, and the
defaults table of docs/torchrun-compat.md (``tools/option_docs.py``; a test holds the doc to it)
all read these names. Bounds on the values are ``limits.py``'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GRACE_PERIOD_S = 30.0  # SIGTERM -> SIGKILL; torchrun's default shutdown timeout
KILL_TIMEOUT_S = 5.0  # SIGKILL -> give up on workers stuck in the kernel
MAX_RESTARTS = 0
RESTART_BACKOFF_S = 1.0  # the first restart waits nothing; restart k >= 2 waits this times 2**(k-2) ...
RESTART_BACKOFF_MAX_S = 30.0  # ... at most this
#: What the launcher forwards and stops on: torchrun's four, plus Slurm's SIGUSR1/SIGUSR2 (sent
#: before a job's time limit). Its helpers ignore them and its guardian takes their defaults back.
HANDLED_SIGNALS: tuple[str, ...] = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
#: Of those, the ones forwarded without stopping the job (checkpoint requests).
FORWARD_ONLY_SIGNALS: tuple[str, ...] = ("SIGUSR1", "SIGUSR2")
CONSOLE_PREFIX = "[rank {rank}] "
TELEMETRY_MODE = "hooks"
#: The live one-line straggler summary's interval; None (--stats-interval-s not given): LIVE_CADENCE_S;
#: 0 = never.
STATS_INTERVAL_S: float | None = None
#: The live line's default cadence, as (until_s, every_s) after the attempt's first live line: the first
#: comes within LIVE_TICK_S of the first steps, then one every 10 s for the first minute (a short run gets
#: its verdict while it runs), then one a minute (a long run's console is not flooded). --stats-file's
#: lines follow it too.
LIVE_CADENCE_S: tuple[tuple[float, float], ...] = ((60.0, 10.0), (math.inf, 60.0))
LIVE_TICK_S = LIVE_CADENCE_S[0][1]  # how often the default cadence looks for steps
STRAGGLER_THRESHOLD_PCT = 5.0  # of the median step
STRAGGLER_THRESHOLD_MARGIN = 0.1  # a rank is named from 90 % of the threshold: a slowdown at it is never missed
#: --on-straggler (runtime.straggler_policy): what the job-wide live verdict's straggler costs its node
#: (agents/straggler_policy.py): none (not even the job's line), report (the line: today's), exclude (elastic).
STRAGGLER_POLICIES: tuple[str, ...] = ("none", "report", "exclude")
STRAGGLER_POLICY = "report"
STRAGGLER_INTERVALS = 3  # exclude: live intervals in a row one node must be named the job's straggler
# exclude: ... each time with an excess of at least this % of the job's step (a pipeline stage's: of its own work)
STRAGGLER_EXCLUDE_PCT = 10.0
STRAGGLER_GRACE_S = 30.0  # exclude: from the checkpoint request to the world's stop
STRAGGLER_COOLDOWN_INTERVALS = 10  # exclude: at most one exclusion per this many live intervals
CHECKPOINT_SIGNAL = "SIGUSR1"  # exclude: the workers' checkpoint request (Slurm's --signal=B:USR1@90)
# With --hang-timeout-s, a rank's first step may take this long at least (imports, data loading, the
# rendezvous, NCCL init, torch.compile of the first step): the start-up allowance's floor.
STARTUP_TIMEOUT_FLOOR_S = 600.0
AGENT_TIMEOUT_S = 300.0  # several nodes: how long the agents wait for every node
KEEPALIVE_S = 15.0  # several nodes: a node silent this long is lost
LAST_CALL_TIMEOUT_S = 30.0  # elastic: once MIN nodes are there, wait this long for more (torchrun's c10d default)
#: elastic, after a failed attempt: how long each GPU's used memory may take to fall back to its level
#: before the job (+ GPU_MEMORY_SLACK_MIB) before its node counts as failing (run/gpu_memory.py).
GPU_MEMORY_TIMEOUT_S = 30.0
GPU_MEMORY_SLACK_MIB = 512.0  # the CUDA context of a tool (nvidia-smi, a monitor) is ~300-500 MiB
RDZV_PORT = 29400  # torchrun's rendezvous port when --rdzv-endpoint has none
MASTER_PORT = 29500  # several nodes with no port given (torchrun's); a one-node job draws a free one
#: ``preflight --slow-pct``: a GEMM or a node pair this many % below its reference is slow and its node
#: excluded (docs/preflight.md). CPU ranks (gloo) share cores, caches and the OS with the rest of the
#: host, and loopback test nodes share one host, so their bar is wider.
PREFLIGHT_SLOW_PCT: dict[str, float] = {"gpu": 10.0, "cpu": 50.0}
#: ``preflight --size-mib`` (config ``preflight.size_mib``): the all-reduce size, by rank kind.
PREFLIGHT_SIZE_MIB: dict[str, int] = {"gpu": 1024, "cpu": 4}
PREFLIGHT_ITERS = 20  # ``preflight --iters`` (config ``preflight.iters``): timed all-reduces per tier
# --replica-groups: torchft's lighthouse (plan/replica_groups.py; docs/replica-groups.md, "The lighthouse").
# torchft 0.2.0's lighthouse cannot be told that a group is gone (its gRPC has Quorum and Heartbeat, its
# HTTP a page and a kill of a live Manager): a killed group counts as healthy until its heartbeat is this
# old, and with two groups the survivor alone is no quorum until then (its split-brain rule). Each
# Manager heartbeats every 100 ms (and at every quorum request); on this 2-core box under load 13 the
# lighthouse saw heartbeats at most 0.11 s old, and at 120 ms it dropped live groups (5 quorum changes in
# 30 s, load 10): 300 ms (torchft's default 5 s) is the shortest with margin (benchmarks/RESULTS.md).
LIGHTHOUSE_HEARTBEAT_TIMEOUT_MS = 300
# How long a quorum waits for a group that heartbeats but has not asked (one restarting; with 3+ groups
# also one killed, until its heartbeat expires): as long as a heartbeat may be late (torchft's 60 s).
LIGHTHOUSE_JOIN_TIMEOUT_MS = LIGHTHOUSE_HEARTBEAT_TIMEOUT_MS
# openclaw's lighthouse only: its first quorum waits for every group the launcher started (``--replica-groups
# K``) and has not said gone, so that a group still importing torch is not left out at the start (a
# quorum without it, then another when it joins: each a reconfiguration for every group), for at most
# this long after the first quorum request, then torchft's rule. Half of a Manager's quorum
# timeout (torchft's default 60 s), so that the first group's waiting request does not time out first.
LIGHTHOUSE_START_TIMEOUT_MS = 30_000
LIGHTHOUSE_QUORUM_TICK_MS = 20  # a waiting quorum looks again this often (torchft's 100 ms)
LIGHTHOUSE_MIN_REPLICAS = 1  # torchft's README: one group is a quorum
#: ``--lighthouse`` (config ``runtime.lighthouse``): whose lighthouse joins the replica groups. openclaw's
#: (run/lighthouse_server.py, needs grpcio and protobuf: the ``torchft`` extra) speaks torchft's
#: protocol and is told at once that a group died, so the others lose no quorum wait; torchft's waits
#: for the dead group's heartbeat to expire. Unset: openclaw's where those are importable, else
#: torchft's (plan says which).
LIGHTHOUSES: tuple[str, ...] = ("openclaw", "torchft")


@dataclass(frozen=True)
class Default:
    """One row of the defaults table."""

    option: str  # its spellings, ", "-separated
    value: str  # as the docs show it
    torchrun: str  # torchrun's default for the same thing; "-" where torchrun has none
    meaning: str


def startup_timeout_s(hang_timeout_s: float | None, given_s: float | None) -> float | None:
    """The start-up allowance in force: none without hang detection; the option's (or config key's)
    value; else the larger of the hang timeout and STARTUP_TIMEOUT_FLOOR_S."""
    if not hang_timeout_s:
        return None
    return given_s if given_s is not None else max(hang_timeout_s, STARTUP_TIMEOUT_FLOOR_S)


def live_gap_s(since_first_line_s: float) -> float:
    """After a live line ``since_first_line_s`` after the attempt's first one: the wait until the next
    (LIVE_CADENCE_S)."""
    return next(every_s for until_s, every_s in LIVE_CADENCE_S if since_first_line_s < until_s)


def _s(seconds: float) -> str:
    return f"{seconds:g} s"


DEFAULTS: tuple[Default, ...] = (
    Default(
        "--grace-period-s, --shutdown-timeout",
        _s(GRACE_PERIOD_S),
        "30 s",
        "after SIGTERM, how long workers get before SIGKILL",
    ),
    Default(
        "--kill-timeout-s", _s(KILL_TIMEOUT_S), "-", "after SIGKILL, how long to wait for workers stuck in the kernel"
    ),
    Default("--max-restarts", str(MAX_RESTARTS), "0", "restarts of the workers after a failure"),
    Default(
        "--restart-backoff-s",
        _s(RESTART_BACKOFF_S),
        "-",
        f"no wait before the first restart (as torchrun); before restart k >= 2: this times 2**(k-2), at most "
        f"{_s(RESTART_BACKOFF_MAX_S)}",
    ),
    Default(
        "--restart-any-class",
        "off",
        "-",
        "restart a failure class a restart cannot help too (cuda-oom, host-oom, not-started), as torchrun "
        "restarts every failure (docs/failures.md)",
    ),
    Default(
        "--storm-guard",
        "off",
        "-",
        "stop instead of restarting when a rank fails the same way before its first step twice in a row",
    ),
    Default(
        "--signals-to-handle",
        ",".join(HANDLED_SIGNALS),
        "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "forwarded to the workers; they stop the job unless also in --forward-signals",
    ),
    Default("--forward-signals", ",".join(FORWARD_ONLY_SIGNALS), "-", "forwarded without stopping the job"),
    Default("--prefix", repr(CONSOLE_PREFIX), "-", "console line prefix"),
    Default("--telemetry", TELEMETRY_MODE, "-", "per-step statistics"),
    Default(
        "--stats-interval-s",
        f"every {_s(LIVE_CADENCE_S[0][1])} for {_s(LIVE_CADENCE_S[0][0])}, then {_s(LIVE_CADENCE_S[1][1])}",
        "-",
        f"the live one-line straggler summary: the first within {_s(LIVE_TICK_S)} of the first steps, then at "
        "that cadence; a number sets a fixed interval (0 = never)",
    ),
    Default(
        "--straggler-threshold-pct",
        f"{STRAGGLER_THRESHOLD_PCT:g} %",
        "-",
        "a straggler makes the step this much longer than the others' pace (its excess: 5/105 of the step);"
        f" named from {100 * (1 - STRAGGLER_THRESHOLD_MARGIN):g} % of it",
    ),
    Default(
        "--on-straggler",
        STRAGGLER_POLICY,
        "-",
        "the job-wide live verdict's straggler: none, report (named on node 0's line) or exclude (an elastic "
        "job takes its node out; docs/elastic.md; config runtime.straggler_policy)",
    ),
    Default(
        "--straggler-intervals",
        str(STRAGGLER_INTERVALS),
        "-",
        "exclude: live intervals in a row one node must be named the job's straggler (at least 2)",
    ),
    Default(
        "--straggler-exclude-pct",
        f"{STRAGGLER_EXCLUDE_PCT:g} %",
        "-",
        "exclude: the straggler's excess, as % of the job's step (a pipeline stage's: of its own work), in each of "
        "those intervals",
    ),
    Default(
        "--straggler-grace-s",
        _s(STRAGGLER_GRACE_S),
        "-",
        "exclude: from the checkpoint request (--checkpoint-signal) to the stop of the world's workers",
    ),
    Default(
        "--straggler-cooldown-intervals",
        str(STRAGGLER_COOLDOWN_INTERVALS),
        "-",
        "exclude: at most one exclusion per this many live intervals",
    ),
    Default("--checkpoint-signal", CHECKPOINT_SIGNAL, "-", "exclude: sent to every worker before the world re-forms"),
    Default("--hang-timeout-s", "off", "-", "no step for this long is a hang (config runtime.hang_timeout_s)"),
    Default(
        "--startup-timeout-s",
        f"max(--hang-timeout-s, {_s(STARTUP_TIMEOUT_FLOOR_S)})",
        "-",
        "no first step this long after the start is a hang (config runtime.startup_timeout_s)",
    ),
    Default("--agent-timeout-s", _s(AGENT_TIMEOUT_S), "-", "several nodes: how long the agents wait for every node"),
    Default("--keepalive-s", _s(KEEPALIVE_S), "-", "several nodes: a node silent this long is lost"),
    Default(
        "--gpu-memory-timeout-s",
        _s(GPU_MEMORY_TIMEOUT_S),
        "-",
        f"elastic: after a failed attempt, each GPU back to its memory before the job (+{GPU_MEMORY_SLACK_MIB:g} MiB) "
        "within this, or its node is taken out",
    ),
    Default(
        "--rdzv-conf last_call_timeout",
        _s(LAST_CALL_TIMEOUT_S),
        _s(LAST_CALL_TIMEOUT_S),
        "elastic --nnodes MIN:MAX: once MIN nodes are there, how long the first world waits for more",
    ),
    Default("--rdzv-endpoint", f"port {RDZV_PORT}", f"port {RDZV_PORT}", "the port (MASTER_PORT) when HOST has none"),
)
