"""torchrun's command line, as one table: parsing (click options), help and docs/torchrun-compat.md.

Every flag of torchrun 2.13/2.14 (both spellings, and its ``PET_*`` variable) is a row here. A row
either carries the flag to one of our options with torchrun's meaning, or says why a value is
refused before anything starts (``torchrun_resolve`` checks and translates the values).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import click

from openclaw_launch.cli import option_types
from openclaw_launch.config.defaults import (
    FORWARD_ONLY_SIGNALS,
    GRACE_PERIOD_S,
    HANDLED_SIGNALS,
    MASTER_PORT,
    MAX_RESTARTS,
    RDZV_PORT,
)


@dataclass(frozen=True)
class Flag:
    """One torchrun flag: its spellings, its PET_ variable, and what it does here."""

    dest: str  # the parameter name the CLI receives
    torchrun: tuple[str, ...]  # torchrun's spellings
    here: str  # what it does in this launcher (help text and the docs table)
    ours: tuple[str, ...] = ()  # our own spelling(s), listed first in --help
    env: tuple[str, ...] = ()  # PET_* (and any other variable torchrun reads for it)
    kwargs: Mapping[str, Any] = field(default_factory=dict)  # click.option's type/default/is_flag

    def option(self) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        where = f" (torchrun: {', '.join(self.torchrun)})" if self.ours else ""
        return click.option(
            *self.ours,
            *self.torchrun,
            self.dest,
            envvar=list(self.env) or None,
            show_envvar=bool(self.env),
            help=self.here + where,
            **self.kwargs,
        )


def _pet(name: str) -> tuple[str, ...]:
    return (f"PET_{name.upper()}",)


def _both(name: str) -> tuple[str, ...]:
    return (f"--{name}", f"--{name.replace('-', '_')}")


FLAGS: tuple[Flag, ...] = (
    Flag(
        "nproc_per_node",
        _both("nproc-per-node"),
        "Ranks on this node: N, or gpu (one per GPU), cpu (one per allowed CPU), auto (gpu if there are "
        "GPUs, else cpu). Default: one per GPU, else 1. Without --config only.",
        env=_pet("nproc_per_node"),
    ),
    Flag(
        "nnodes",
        ("--nnodes",),
        "Nodes in the job: N, or N:N. Without --config: N identical hosts, one launcher on each with "
        "--node-rank (or c10d: ranks by arrival); with --config it must equal the config's node count. "
        "MIN:MAX (elastic, c10d without --config): the job starts with MIN..MAX nodes and re-forms when "
        "one is lost or arrives (docs/elastic.md).",
        env=_pet("nnodes"),
    ),
    Flag(
        "node_rank",
        _both("node-rank"),
        "This node's index (GROUP_RANK): ranks K*nproc .. K*nproc+nproc-1; with --config, its K-th node.",
        env=_pet("node_rank"),
        kwargs={"type": option_types.node_rank()},
    ),
    Flag(
        "rdzv_backend",
        _both("rdzv-backend"),
        "static (default) or c10d: one fixed world. c10d with several nodes and no --node-rank: the "
        "launchers' agents meet at --rdzv-endpoint and rank the nodes by arrival (the endpoint's host is "
        "node 0); with --nnodes MIN:MAX the agents' rendezvous re-forms the world. etcd and etcd-v2 are refused.",
        env=_pet("rdzv_backend"),
    ),
    Flag(
        "rdzv_endpoint",
        _both("rdzv-endpoint"),
        f"HOST[:PORT]: MASTER_ADDR and MASTER_PORT of every rank (port default {RDZV_PORT}; HOST:0: a free "
        "port, one node only). c10d ranked by arrival: where the agents meet; MASTER_PORT is node 0's free port.",
        env=_pet("rdzv_endpoint"),
    ),
    Flag(
        "run_id",
        _both("rdzv-id"),
        "Job id shared by all nodes: TORCHELASTIC_RUN_ID, the log sub-directory (default: $SLURM_JOB_ID "
        "under Slurm, else random).",
        ours=("--run-id",),
        env=_pet("rdzv_id"),
    ),
    Flag(
        "rdzv_conf",
        _both("rdzv-conf"),
        "KEY=VALUE,... rendezvous tuning: last_call_timeout=S (elastic: once MIN nodes are there, how long "
        "the first world waits for more; default 30 as torchrun); other keys are checked, no effect.",
        env=_pet("rdzv_conf"),
    ),
    Flag(
        "standalone",
        ("--standalone",),
        "Single-node job on a free MASTER_PORT, whatever --master-port or --rdzv-endpoint say (as torchrun); "
        "refused with --nnodes > 1.",
        env=_pet("standalone"),
        kwargs={"is_flag": True},
    ),
    Flag(
        "max_restarts",
        _both("max-restarts"),
        "Restart the job's workers this many times after a failure: with several nodes every node "
        "restarts together (lockstep) or none does.",
        env=_pet("max_restarts"),
        kwargs={"type": option_types.restarts(), "default": MAX_RESTARTS, "show_default": True},
    ),
    Flag(
        "monitor_interval",
        _both("monitor-interval"),
        "Accepted, not needed: worker exits and output are seen at once (event loop, no polling).",
        env=_pet("monitor_interval"),
        kwargs={"type": option_types.seconds()},
    ),
    Flag(
        "start_method",
        _both("start-method"),
        "Accepted, not needed: every worker is a fresh process (fork+exec of its command).",
        env=_pet("start_method"),
        kwargs={"type": click.Choice(["spawn", "fork", "forkserver"])},
    ),
    Flag(
        "event_log_handler",
        _both("event-log-handler"),
        "null (the default) only: torchelastic's event plugins do not exist here; use --report.",
        env=_pet("event_log_handler"),
    ),
    Flag(
        "role",
        ("--role",),
        "ROLE_NAME of every worker (default: default).",
        env=_pet("role"),
        kwargs={"default": "default", "show_default": True},
    ),
    Flag(
        "module",
        ("-m", "--module"),
        "Run the target as a Python module (python -u -m).",
        env=_pet("module"),
        kwargs={"is_flag": True},
    ),
    Flag(
        "no_python",
        _both("no-python"),
        "Run the target as a command, not a Python script.",
        env=_pet("no_python"),
        kwargs={"is_flag": True},
    ),
    Flag(
        "run_path",
        _both("run-path"),
        "Run the script as __main__ (here: python -u SCRIPT, one process per rank); wins over --no-python.",
        env=_pet("run_path"),
        kwargs={"is_flag": True},
    ),
    Flag(
        "log_dir",
        _both("log-dir"),
        "Per-rank stdout/stderr logs under DIR/<run-id>/attempt-N/rank-R/ and error files under "
        "DIR/<run-id>/errors/attempt-N/rank-R/ (every attempt's), kept after the job.",
        env=_pet("log_dir"),
        kwargs={"type": click.Path(file_okay=False)},
    ),
    Flag(
        "redirects",
        ("-r", "--redirects"),
        "Streams sent to the log only, not the console (unless --tee names them too): 0 none, 1 stdout, "
        "2 stderr, 3 both, or per local rank like 0:1,1:2 (a temporary log directory if no --log-dir).",
        env=_pet("redirects"),
    ),
    Flag(
        "tee",
        ("-t", "--tee"),
        "Streams written to the log and the console (format of --redirects; it wins over --redirects, "
        "as under torchrun); every stream is logged whenever there is a log directory.",
        env=_pet("tee"),
    ),
    Flag(
        "local_ranks_filter",
        _both("local-ranks-filter"),
        "Local ranks shown on the console, like 0,1 (--console-ranks by local rank); logs keep every rank.",
        env=_pet("local_ranks_filter"),
    ),
    Flag(
        "duplicate_stdout_filters",
        _both("duplicate-stdout-filters"),
        "Empty only: copying matching lines to another file is not done here; grep the --log-dir logs.",
        env=_pet("duplicate_stdout_filters"),
    ),
    Flag(
        "duplicate_stderr_filters",
        _both("duplicate-stderr-filters"),
        "Empty only: copying matching lines to another file is not done here; grep the --log-dir logs.",
        env=_pet("duplicate_stderr_filters"),
    ),
    Flag(
        "master_addr",
        _both("master-addr"),
        "MASTER_ADDR of every rank (default: config, else the first node's ip, else Slurm's first host; "
        "127.0.0.1 only for one node, several nodes without an address are an error).",
        env=_pet("master_addr"),
    ),
    Flag(
        "master_port",
        _both("master-port"),
        "MASTER_PORT of every rank; 0: a free one (one node only). Default: config, else a free port for a "
        f"one-node job, {MASTER_PORT} for several nodes ($MASTER_PORT of the shell is ignored, as by torchrun).",
        env=_pet("master_port"),
        kwargs={"type": click.IntRange(0, 65535)},
    ),
    Flag(
        "local_addr",
        _both("local-addr"),
        "Accepted, no effect: ranks meet at MASTER_ADDR; this node's own address is not needed.",
        env=_pet("local_addr"),
    ),
    Flag(
        "logs_specs",
        _both("logs-specs"),
        "Refused: torchrun's log plugins do not exist here; use --log-dir, --redirects, --tee.",
    ),
    Flag(
        "numa_binding",
        _both("numa-binding"),
        "Binding policy (runtime.binding): node, socket or exclusive; core-complex is refused.",
        kwargs={"type": click.Choice(["node", "socket", "exclusive", "core-complex"])},
    ),
    Flag(
        "signals_to_handle",
        _both("signals-to-handle"),
        "Signals forwarded to the workers that also stop the job (SIGKILL after the grace period), like "
        "SIGTERM,USR1,15 (names in any case, with or without SIG, or numbers; the workers' "
        f"TORCHELASTIC_SIGNALS_TO_HANDLE gets the names). Default: {','.join(HANDLED_SIGNALS)}; those also in "
        f"--forward-signals (default {','.join(FORWARD_ONLY_SIGNALS)}) are forwarded only: the job goes on.",
        env=_pet("signals_to_handle"),
        kwargs={"type": option_types.signal_list()},
    ),
    Flag(
        "grace_period_s",
        _both("shutdown-timeout"),
        "After SIGTERM, how long workers get before SIGKILL; workers that exit end the job at once.",
        ours=("--grace-period-s",),
        env=(*_pet("shutdown_timeout"), "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"),
        kwargs={"type": option_types.seconds(), "default": GRACE_PERIOD_S, "show_default": True},
    ),
    Flag(
        "virtual_local_rank",
        _both("virtual-local-rank"),
        "LOCAL_RANK=0 in every worker, which sees only its own GPU (visible_devices: isolated).",
        env=_pet("virtual_local_rank"),
        kwargs={"is_flag": True},
    ),
)

# Variables torchrun reads besides PET_*, and what they do here (docs table).
OTHER_VARIABLES: tuple[tuple[str, str], ...] = (
    ("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "grace period when --shutdown-timeout / --grace-period-s is not given"),
    (
        "TORCHELASTIC_ERROR_FILE",
        "set in the launcher's environment: receives the root cause of a failed job in torchrun's format "
        "(each worker gets its own file, as under torchrun)",
    ),
    ("PYTHON_EXEC", "the interpreter for script and module targets (default: the launcher's)"),
    (
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
        "console prefix when --prefix is not given; ${rank}, ${local_rank}, ${role_name} are filled in",
    ),
    (
        "MASTER_PORT, MASTER_ADDR",
        "ignored in the launching shell, as by torchrun (a warning says so): the workers get the plan's; "
        "choose them with --master-port / --master-addr or PET_MASTER_PORT / PET_MASTER_ADDR",
    ),
)


@dataclass(frozen=True)
class TorchrunArgs:
    """The values of every row of ``FLAGS``, as click parsed them (flag, PET_ variable or default)."""

    nproc_per_node: str | None
    nnodes: str | None
    node_rank: int | None
    rdzv_backend: str | None
    rdzv_endpoint: str | None
    run_id: str | None
    rdzv_conf: str | None
    standalone: bool
    max_restarts: int
    monitor_interval: float | None
    start_method: str | None
    event_log_handler: str | None
    role: str
    module: bool
    no_python: bool
    run_path: bool
    log_dir: str | None
    redirects: str | None
    tee: str | None
    local_ranks_filter: str | None
    duplicate_stdout_filters: str | None
    duplicate_stderr_filters: str | None
    master_addr: str | None
    master_port: int | None
    local_addr: str | None
    logs_specs: str | None
    numa_binding: str | None
    signals_to_handle: tuple[str, ...] | None  # canonical names (config/signals.py)
    grace_period_s: float
    virtual_local_rank: bool
