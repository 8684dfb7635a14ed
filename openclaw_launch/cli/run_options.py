"""The options of ``run``, defined once: ``run`` and ``plan`` both take every one of them, so a
``run`` command line planned with ``plan`` shows exactly what it would execute (one ``RunOptions``).

Only ``--telemetry``, ``--hang-timeout-s`` and ``--stats-interval-s`` (the workers' flush interval)
change what a rank runs; ``plan`` checks the others as ``run --dry-run`` does (a bad value is exit 2
in both) and has no use for them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import click

from openclaw_launch.cli import option_types
from openclaw_launch.config import defaults
from openclaw_launch.config.signals import signal_numbers
from openclaw_launch.job.agents import AgentWaits
from openclaw_launch.limits import (
    MAX_STRAGGLER_INTERVALS,
    MIN_AGENT_TIMEOUT_S,
    MIN_KEEPALIVE_S,
    MIN_STRAGGLER_INTERVALS,
)
from openclaw_launch.telemetry.wire import TELEMETRY_MODES


@dataclass(frozen=True)
class RunOptions:
    """Every ``run`` option besides the shared ``Common`` ones, as click parsed them."""

    restart_backoff_s: float
    restart_any_class: bool
    storm_guard: bool
    kill_timeout_s: float
    console_ranks: str
    prefix_template: str | None
    report_path: str | None
    telemetry: str
    stats_interval_s: float | None  # None: defaults.LIVE_CADENCE_S
    straggler_threshold_pct: float
    hang_timeout_s: float | None
    startup_timeout_s: float | None
    metrics_port: int | None
    stats_file: str | None
    forward_signals: tuple[str, ...]  # canonical names (config/signals.py)
    agent_port: int | None
    agent_timeout_s: float
    keepalive_s: float
    standby: bool
    exclude_file: str | None  # None: runtime.exclude_file (cli/exclude.py)
    gpu_memory_timeout_s: float
    job_report_path: str | None
    preflight_first: bool
    exit_code_classes: bool
    on_straggler: str | None  # None: runtime.straggler_policy, else defaults.STRAGGLER_POLICY (and the knobs alike)
    straggler_intervals: int | None
    straggler_exclude_pct: float | None
    straggler_grace_s: float | None
    straggler_cooldown_intervals: int | None
    checkpoint_signal: tuple[str, ...] | None
    replica_groups: int | None  # None: runtime.replica_groups, else none (cli/replica_groups.py)
    lighthouse: str | None  # None: runtime.lighthouse, else cli/replica_groups.py's default
    dry_run: bool

    def agent_waits(self) -> AgentWaits:
        return AgentWaits(self.agent_timeout_s, self.keepalive_s)


_run_options: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
    click.option(
        "--restart-backoff-s",
        type=option_types.seconds(),
        default=defaults.RESTART_BACKOFF_S,
        show_default=True,
        help="No wait before the first restart (as torchrun); before restart k >= 2: this times 2**(k-2) "
        f"(at most {defaults.RESTART_BACKOFF_MAX_S:g} s).",
    ),
    click.option(
        "--restart-any-class",
        is_flag=True,
        envvar="OPENCLAW_RESTART_ANY_CLASS",
        help="Restart a failure whose class says a restart cannot help too (cuda-oom, host-oom, not-started), "
        "as torchrun restarts every failure; the line says so (docs/failures.md).",
    ),
    click.option(
        "--storm-guard",
        is_flag=True,
        envvar="OPENCLAW_STORM_GUARD",
        help="Stop instead of restarting when a rank fails with the same class before its first step in two "
        "attempts in a row (a restart storm; docs/failures.md).",
    ),
    click.option(
        "--kill-timeout-s",
        type=option_types.seconds(),
        default=defaults.KILL_TIMEOUT_S,
        show_default=True,
        help="After SIGKILL, how long to wait for workers stuck in the kernel before giving up.",
    ),
    click.option(
        "--console-ranks",
        default="all",
        show_default=True,
        help="Ranks shown on the console: all, none, or 0,3-5 (torchrun's --local-ranks-filter, by global rank).",
    ),
    click.option(
        "--prefix",
        "prefix_template",
        default=None,
        help="Console line prefix; fields {rank}, {local_rank}, {node} "
        f"(default: {defaults.CONSOLE_PREFIX!r}, or "
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE).",
    ),
    click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Write the run report JSON here."),
    click.option(
        "--telemetry",
        type=click.Choice(TELEMETRY_MODES),
        default=defaults.TELEMETRY_MODE,
        show_default=True,
        help="Per-step statistics: hooks = zero-code torch hooks and the telemetry API; full = the same plus, "
        "on GPUs, NCCL's flight recorder (a second wait signal for slow GPU work and a hang's cause; it cost "
        "1.7 % of step time on an H200); api = only telemetry.step()/section(); off = none. torchrun has none.",
    ),
    click.option(
        "--stats-interval-s",
        type=option_types.seconds(),
        default=defaults.STATS_INTERVAL_S,
        help="Print a one-line straggler summary this often while the job runs (0 = never). Default: the first "
        "within 10 s of the first steps, then every 10 s for the first minute, then every 60 s.",
    ),
    click.option(
        "--straggler-threshold-pct",
        type=option_types.percent(),
        default=defaults.STRAGGLER_THRESHOLD_PCT,
        show_default=True,
        help=(
            "Name a straggler whose steps run this % longer than the other ranks' pace would make them "
            "(an excess of t/(100+t) of the step, judged on 5-step windows; named from "
            f"{100 * (1 - defaults.STRAGGLER_THRESHOLD_MARGIN):g} % of it)."
        ),
    ),
    click.option(
        "--hang-timeout-s",
        type=option_types.hang_timeout(),
        default=None,
        help="A rank with no step for this long (armed after its first step) is a hang: it is named with its "
        "stack, every rank's stack goes to its log, and the job stops with exit code 124 (default: off; "
        "config runtime.hang_timeout_s). docs/hangs-and-metrics.md.",
    ),
    click.option(
        "--startup-timeout-s",
        type=option_types.hang_timeout(),
        default=None,
        help="With hang detection: a rank without a first step this long after the start (stuck before or in "
        "init_process_group, the rendezvous, NCCL init) is a hang: named with every rank's stack, exit code 124 "
        f"(default: the larger of --hang-timeout-s and {defaults.STARTUP_TIMEOUT_FLOOR_S:g} s; config "
        "runtime.startup_timeout_s). docs/hangs-and-metrics.md.",
    ),
    click.option(
        "--metrics-port",
        type=click.IntRange(0, 65535),
        default=None,
        help="Serve live per-rank and per-GPU metrics in Prometheus format on this port (0 = any free port; "
        "needs the 'metrics' extra, prometheus-client). Default: off.",
    ),
    click.option(
        "--stats-file",
        "stats_file",
        type=click.Path(dir_okay=False),
        default=None,
        help="Append the live statistics as one JSON line every --stats-interval-s (and one at the end).",
    ),
    click.option(
        "--forward-signals",
        type=option_types.signal_list(allow_none=True),
        default=",".join(defaults.FORWARD_ONLY_SIGNALS),
        show_default=True,
        envvar="OPENCLAW_FORWARD_SIGNALS",
        help="Signals forwarded to the workers WITHOUT stopping the job (checkpoint requests: Slurm's "
        "--signal=B:USR1@90); 'none' for none. A signal here and in --signals-to-handle is forwarded only.",
    ),
    click.option(
        "--agent-port",
        type=click.IntRange(1, 65535),
        envvar="OPENCLAW_AGENT_PORT",
        help="Several nodes: the port the first node's agent listens on (default MASTER_PORT+1).",
    ),
    click.option(
        "--agent-timeout-s",
        type=option_types.seconds(MIN_AGENT_TIMEOUT_S),
        default=defaults.AGENT_TIMEOUT_S,
        show_default=True,
        envvar="OPENCLAW_AGENT_TIMEOUT_S",
        help="Several nodes: how long the agents wait for every node before starting nothing.",
    ),
    click.option(
        "--keepalive-s",
        type=option_types.seconds(MIN_KEEPALIVE_S),
        default=defaults.KEEPALIVE_S,
        show_default=True,
        envvar="OPENCLAW_KEEPALIVE_S",
        help="Several nodes: a node silent this long is lost, and every other node stops its workers.",
    ),
    click.option(
        "--standby",
        is_flag=True,
        envvar="OPENCLAW_STANDBY",
        help="Elastic (--nnodes MIN:MAX): join the rendezvous but run no ranks until a node is lost, then take "
        "its node rank (the world keeps its size); exits 0 if the job ends without it (docs/elastic.md).",
    ),
    click.option(
        "--exclude-file",
        "exclude_file",
        type=click.Path(dir_okay=False),
        default=None,
        help="Elastic: add each node the job takes out for good (a failing node, GPU memory not freed, a "
        "straggler) to this file, as the Slurm hostlist sbatch --exclude takes; the reasons go to FILE.reasons "
        "(config runtime.exclude_file; docs/elastic.md).",
    ),
    click.option(
        "--gpu-memory-timeout-s",
        type=option_types.seconds(),
        default=defaults.GPU_MEMORY_TIMEOUT_S,
        show_default=True,
        help="Elastic: after a failed attempt, each of the node's GPUs must be back to its used memory before "
        f"the job (+{defaults.GPU_MEMORY_SLACK_MIB:g} MiB) within this, or the node is taken out "
        "(gpu-memory-held; docs/elastic.md).",
    ),
    click.option(
        "--job-report",
        "job_report_path",
        type=click.Path(dir_okay=False),
        help="Several nodes: the first node writes the whole job's report here (default: next to --report, "
        "with -job before .json).",
    ),
    click.option(
        "--preflight",
        "preflight_first",
        is_flag=True,
        help="First run `preflight` with this plan (config preflight: settings); a failing tier or probe starts "
        "nothing and exits with preflight's code (docs/preflight.md); a warning starts the job.",
    ),
    click.option(
        "--exit-code-classes",
        is_flag=True,
        envvar="OPENCLAW_EXIT_CODE_CLASSES",
        help="A failed job exits 75 when a restart can help (a node, GPU or the fabric failed, a hang: requeue) "
        "and 70 when not (the script failed: do not requeue), by the failure class, instead of the worker's "
        "code; for a Slurm --requeue script (docs/failures.md).",
    ),
    click.option(
        "--replica-groups",
        type=int,
        default=None,
        help="torchft's replica groups as one command: start a lighthouse (--lighthouse) and cut this node's ranks "
        "into K worlds, each with its own MASTER_PORT, REPLICA_GROUP_ID, NUM_REPLICA_GROUPS and TORCHFT_LIGHTHOUSE, "
        "each supervised and restarted (--max-restarts) on its own while the others keep stepping; the script "
        "uses torchft's Manager (config runtime.replica_groups; needs torchft; docs/replica-groups.md).",
    ),
    click.option(
        "--lighthouse",
        type=click.Choice(defaults.LIGHTHOUSES),
        default=None,
        help="--replica-groups: whose lighthouse joins the groups: openclaw's (torchft's protocol and quorum rule, "
        "told at once when a group dies: the others do not wait for its heartbeat to expire; needs grpcio and "
        "protobuf) or torchft's (config runtime.lighthouse; default openclaw where those are installed).",
    ),
    click.option(
        "--on-straggler",
        type=click.Choice(defaults.STRAGGLER_POLICIES),
        default=None,
        help="The job-wide live verdict's straggler (node 0's line): report names it (default); none does not "
        "print the line; exclude takes its node out of an elastic job: a checkpoint request, a grace, then the "
        "world re-forms without it, a standby in its place (config runtime.straggler_policy; docs/elastic.md).",
    ),
    click.option(
        "--straggler-intervals",
        type=click.IntRange(MIN_STRAGGLER_INTERVALS, MAX_STRAGGLER_INTERVALS),
        default=None,
        help=f"exclude: live intervals in a row one node must be named the job's straggler (default "
        f"{defaults.STRAGGLER_INTERVALS}; config runtime.straggler_intervals).",
    ),
    click.option(
        "--straggler-exclude-pct",
        type=click.FloatRange(0, 100, min_open=True),
        default=None,
        help=f"exclude: ... each time with an excess of at least this % of the job's step (a pipeline stage's: of "
        f"its own work; default "
        f"{defaults.STRAGGLER_EXCLUDE_PCT:g}; config runtime.straggler_exclude_pct).",
    ),
    click.option(
        "--straggler-grace-s",
        type=option_types.seconds(),
        default=None,
        help=f"exclude: from the checkpoint request to the stop of every worker (default "
        f"{defaults.STRAGGLER_GRACE_S:g}; config runtime.straggler_grace_s).",
    ),
    click.option(
        "--straggler-cooldown-intervals",
        type=click.IntRange(1, MAX_STRAGGLER_INTERVALS),
        default=None,
        help=f"exclude: at most one exclusion per this many live intervals (default "
        f"{defaults.STRAGGLER_COOLDOWN_INTERVALS}; config runtime.straggler_cooldown_intervals).",
    ),
    click.option(
        "--checkpoint-signal",
        type=option_types.signal_list(),
        default=None,
        help=f"exclude: the signal every worker gets to checkpoint before the world re-forms (default "
        f"{defaults.CHECKPOINT_SIGNAL}; config runtime.checkpoint_signal).",
    ),
    click.option("--dry-run", is_flag=True, help="Print the plan and start nothing (`plan` never starts anything)."),
]


def with_run_options(f: Callable[..., None]) -> Callable[..., None]:
    """Add every ``run`` option and hand them to ``f`` as one ``RunOptions``, after ``Common``."""

    @functools.wraps(f)
    def wrapper(c: object, **kw: Any) -> None:
        r = RunOptions(**{name: kw.pop(name) for name in RunOptions.__dataclass_fields__})
        f(c, r, **kw)

    for option in reversed(_run_options):
        wrapper = option(wrapper)
    return wrapper


def console_ranks(text: str) -> frozenset[int] | None:
    """``--console-ranks``: ``all`` -> None (every rank), ``none`` -> no rank, else a list like ``0,3-5``."""
    if text == "all":
        return None
    if text == "none":
        return frozenset()
    from openclaw_launch.topology.cpulist import parse_cpulist

    try:
        return frozenset(parse_cpulist(text))
    except ValueError as e:
        raise click.BadParameter(
            f"{text!r}: use all, none, or ranks like 0,3-5 ({e})", param_hint="--console-ranks"
        ) from None


@dataclass(frozen=True)
class ConsoleChoices:
    """What the console and signal options ask of the supervisor, checked before anything starts."""

    prefix: str
    ranks_shown: frozenset[int] | None  # global ranks; None = every rank (see local_ranks_shown)
    pass_signals: tuple[int, ...]


def console_choices(r: RunOptions, role: str, local_ranks_given: bool, environ: Mapping[str, str]) -> ConsoleChoices:
    """``--prefix`` (or TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE), ``--console-ranks`` and
    ``--forward-signals``; a bad value raises ``click`` errors (exit 2), in ``run`` and ``plan`` alike."""
    from openclaw_launch.cli.torchrun_resolve import check_prefix, prefix_from_env

    env_prefix = environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")
    if r.prefix_template is not None:
        prefix = check_prefix(r.prefix_template)
    elif env_prefix:
        prefix = check_prefix(prefix_from_env(env_prefix, role), "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")
    else:
        prefix = defaults.CONSOLE_PREFIX
    signals = signal_numbers(r.forward_signals)
    if local_ranks_given and r.console_ranks != "all":
        raise click.UsageError("--console-ranks and --local-ranks-filter both choose the console's ranks; give one")
    return ConsoleChoices(prefix=prefix, ranks_shown=console_ranks(r.console_ranks), pass_signals=signals)


def startup_timeout_s(r: RunOptions, config_s: float | None, hang_timeout_s: float | None) -> float | None:
    """The start-up allowance ``run`` gives the hang watch (``plan`` checks it alike): the option, else
    the config's ``runtime.startup_timeout_s``, else the default; a usage error without hang detection."""
    given_s = r.startup_timeout_s if r.startup_timeout_s is not None else config_s
    if given_s is not None and not hang_timeout_s:
        raise click.UsageError("--startup-timeout-s (runtime.startup_timeout_s) needs --hang-timeout-s")
    return defaults.startup_timeout_s(hang_timeout_s, given_s)
