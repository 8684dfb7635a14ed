"""torchrun's command line, as one table: parsing (click options), help and docs/torchrun-compat.md.

Every flag of torchrun 2.13/2.14 (both spellings, and its ``PET_*`` variable) is a row here. A row
either carries the flag to one of our options with torchrun's meaning, or says why a value is
refused before anything starts. ``resolve`` turns the parsed values into what the planner and the
supervisor need; it does no I/O, so ``plan`` and ``run`` read a torchrun command line alike.
"""

from __future__ import annotations

import signal
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import click

DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0  # torchrun's default grace period (TORCH_ELASTIC_SHUTDOWN_TIMEOUT)
RDZV_DEFAULT_PORT = 29400  # torchrun's rendezvous port when --rdzv-endpoint has none
# What the launcher forwards when --signals-to-handle is not given: torchrun's four, plus Slurm's
# SIGUSR1/SIGUSR2 (sent before a job's time limit).
DEFAULT_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
_STD_STREAMS = {0: (), 1: ("stdout",), 2: ("stderr",), 3: ("stdout", "stderr")}  # torchrun's Std


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
        "--node-rank; with --config it must equal the config's node count. MIN:MAX (elastic) is refused.",
        env=_pet("nnodes"),
    ),
    Flag(
        "node_rank",
        _both("node-rank"),
        "This node's index (GROUP_RANK): ranks K*nproc .. K*nproc+nproc-1; with --config, its K-th node.",
        env=_pet("node_rank"),
        kwargs={"type": click.IntRange(min=0)},
    ),
    Flag(
        "rdzv_backend",
        _both("rdzv-backend"),
        "static (default) or c10d: both mean one fixed world here (no rendezvous service runs). "
        "etcd and etcd-v2 (elastic membership) are refused.",
        env=_pet("rdzv_backend"),
    ),
    Flag(
        "rdzv_endpoint",
        _both("rdzv-endpoint"),
        f"HOST[:PORT]: MASTER_ADDR and MASTER_PORT of every rank (port default {RDZV_DEFAULT_PORT}).",
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
        "KEY=VALUE,... rendezvous tuning: checked, no effect (no rendezvous runs).",
        env=_pet("rdzv_conf"),
    ),
    Flag(
        "standalone",
        ("--standalone",),
        "Single-node job on a free MASTER_PORT (the default for one node anyway); refused with --nnodes > 1.",
        env=_pet("standalone"),
        kwargs={"is_flag": True},
    ),
    Flag(
        "max_restarts",
        _both("max-restarts"),
        "Restart the node's whole group this many times after a failure.",
        env=_pet("max_restarts"),
        kwargs={"type": click.IntRange(min=0), "default": 0, "show_default": True},
    ),
    Flag(
        "monitor_interval",
        _both("monitor-interval"),
        "Accepted, not needed: worker exits and output are seen at once (event loop, no polling).",
        env=_pet("monitor_interval"),
        kwargs={"type": click.FloatRange(min=0)},
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
        "Per-rank stdout/stderr logs and error files under DIR/<run-id>/attempt-N/rank-R/, kept after the job.",
        env=_pet("log_dir"),
        kwargs={"type": click.Path(file_okay=False)},
    ),
    Flag(
        "redirects",
        ("-r", "--redirects"),
        "Streams sent to the log only, not the console: 0 none, 1 stdout, 2 stderr, 3 both, or per local "
        "rank like 0:1,1:2 (a temporary log directory if no --log-dir).",
        env=_pet("redirects"),
    ),
    Flag(
        "tee",
        ("-t", "--tee"),
        "Streams written to the log and the console (format of --redirects); every stream is logged "
        "whenever there is a log directory.",
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
        "MASTER_ADDR of every rank (default: config, else the first node's ip, else 127.0.0.1).",
        env=_pet("master_addr"),
    ),
    Flag(
        "master_port",
        _both("master-port"),
        "MASTER_PORT of every rank (default: config, then $MASTER_PORT; else a free port for a one-node "
        "job, 29500 for several nodes).",
        env=_pet("master_port"),
        kwargs={"type": click.IntRange(1, 65535)},
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
        "Signals forwarded to the workers, like SIGTERM,SIGINT (also TORCHELASTIC_SIGNALS_TO_HANDLE of "
        f"the workers). Default: {','.join(DEFAULT_SIGNALS)}.",
        env=_pet("signals_to_handle"),
    ),
    Flag(
        "grace_period_s",
        _both("shutdown-timeout"),
        "After SIGTERM, how long workers get before SIGKILL; workers that exit end the job at once.",
        ours=("--grace-period-s",),
        env=(*_pet("shutdown_timeout"), "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"),
        kwargs={"type": click.FloatRange(min=0), "default": DEFAULT_SHUTDOWN_TIMEOUT_S, "show_default": True},
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
    ("MASTER_PORT", "the rendezvous port when neither --master-port nor the config gives one"),
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
    signals_to_handle: str | None
    grace_period_s: float
    virtual_local_rank: bool


@dataclass(frozen=True)
class Resolved:
    """What the torchrun flags ask of the planner and the supervisor."""

    nproc_per_node: int | str | None  # N, "gpu", "cpu", "auto", or None (our default)
    nnodes: int | None  # None: not given
    node_rank: int | None
    master_addr: str | None
    master_port: int | None
    binding: str | None  # overrides runtime.binding
    signals: tuple[str, ...]  # forwarded, by name
    console_hidden: frozenset[tuple[int, str]]  # (local rank, stream) kept off the console (--redirects)
    wants_logs: bool  # --redirects/--tee: a log directory is needed
    local_ranks_shown: frozenset[int] | None  # --local-ranks-filter


def _bad(option: str, message: str) -> click.BadParameter:
    return click.BadParameter(message, param_hint=option)


def resolve(args: TorchrunArgs, with_config: bool) -> Resolved:
    """Check every torchrun value and translate it; a refused value raises ``click.BadParameter``."""
    if args.logs_specs is not None:
        raise _bad("--logs-specs", "log plugins are torchrun's; use --log-dir, --redirects and --tee here")
    if args.event_log_handler not in (None, "null"):
        raise _bad("--event-log-handler", "event plugins are torchrun's; use --report PATH for a run record")
    for name, value in (("stdout", args.duplicate_stdout_filters), ("stderr", args.duplicate_stderr_filters)):
        if value:
            raise _bad(f"--duplicate-{name}-filters", "not done here; grep the per-rank logs of --log-dir")
    if args.numa_binding == "core-complex":
        raise _bad("--numa-binding", "core-complex is not a binding policy here; use node, socket or exclusive")
    if args.module and args.no_python and not args.run_path:
        raise _bad("--module", "-m and --no-python exclude each other")
    _check_rdzv_conf(args.rdzv_conf)
    nnodes = _nnodes(args.nnodes)
    backend = args.rdzv_backend or "static"
    if backend not in ("static", "c10d"):
        raise _bad(
            "--rdzv-backend",
            f"{backend}: elastic rendezvous is not done here; every node gets a fixed rank: "
            "--nnodes N --node-rank K (static or c10d), or --config",
        )
    if args.standalone and (nnodes or 1) > 1:
        raise _bad("--standalone", f"is a single-node job, but --nnodes is {nnodes}")
    if backend == "c10d" and (nnodes or 1) > 1 and args.node_rank is None and not with_config:
        raise _bad(
            "--rdzv-backend",
            "c10d ranks nodes by arrival, which is not done here: give each node --node-rank K",
        )
    if args.node_rank is not None and nnodes is not None and args.node_rank >= nnodes:
        raise _bad("--node-rank", f"{args.node_rank} but --nnodes is {nnodes} (ranks are 0..{nnodes - 1})")
    if args.node_rank is not None and nnodes is None and args.node_rank > 0 and not with_config:
        raise _bad("--node-rank", f"{args.node_rank} needs --nnodes (the number of nodes)")
    addr, port = args.master_addr, args.master_port
    if args.rdzv_endpoint and not args.standalone:
        addr, port = _endpoint(args.rdzv_endpoint)
    hidden = _streams(args.redirects, "--redirects")
    teed = _streams(args.tee, "--tee")
    return Resolved(
        nproc_per_node=_nproc(args.nproc_per_node),
        nnodes=nnodes,
        node_rank=args.node_rank,
        master_addr=addr,
        master_port=port,
        binding=args.numa_binding,
        signals=_signals(args.signals_to_handle),
        console_hidden=hidden,
        wants_logs=bool(hidden or teed),
        local_ranks_shown=_local_ranks(args.local_ranks_filter),
    )


def _nproc(text: str | None) -> int | str | None:
    if text is None:
        return None
    if text in ("gpu", "cpu", "auto"):
        return text
    if text == "xpu":
        raise _bad("--nproc-per-node", "xpu: this launcher places ranks on NVIDIA GPUs or CPUs (gpu, cpu, auto, N)")
    try:
        n = int(text)
    except ValueError:
        raise _bad("--nproc-per-node", f"{text!r}: use a number >= 1, gpu, cpu or auto") from None
    if n < 1:
        raise _bad("--nproc-per-node", f"{n}: use a number >= 1, gpu, cpu or auto")
    return n


def _nnodes(text: str | None) -> int | None:
    if text is None:
        return None
    low, _, high = text.partition(":")
    try:
        lo, hi = int(low), int(high or low)
    except ValueError:
        raise _bad("--nnodes", f"{text!r}: use N (or N:N)") from None
    if lo != hi:
        raise _bad("--nnodes", f"{text}: elastic membership (MIN:MAX) is not done here; use a fixed N")
    if lo < 1:
        raise _bad("--nnodes", f"{text}: use N >= 1")
    return lo


def _endpoint(text: str) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]:port`` -> (host, port)."""
    host, port = text, ""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    if not host:
        raise _bad("--rdzv-endpoint", f"{text!r}: use HOST[:PORT]")
    if not port:
        return host, RDZV_DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise _bad("--rdzv-endpoint", f"{text!r}: the port must be 1..65535")
    return host, int(port)


def _check_rdzv_conf(text: str | None) -> None:
    for item in filter(None, (text or "").split(",")):
        if "=" not in item:
            raise _bad("--rdzv-conf", f"{item!r}: use KEY=VALUE,KEY=VALUE")


def _streams(text: str | None, option: str) -> frozenset[tuple[int, str]]:
    """torchrun's Std: one code for every local rank (as local rank -1), or ``rank:code,...``."""
    if not text:
        return frozenset()
    out: set[tuple[int, str]] = set()
    try:
        if ":" not in text:
            return frozenset((-1, s) for s in _STD_STREAMS[int(text)])
        for item in text.split(","):
            rank, _, code = item.partition(":")
            out.update((int(rank), s) for s in _STD_STREAMS[int(code)])
    except (ValueError, KeyError):
        raise _bad(option, f"{text!r}: use 0 (none), 1 (stdout), 2 (stderr), 3 (both), or like 0:1,1:2") from None
    return frozenset(out)


def _local_ranks(text: str | None) -> frozenset[int] | None:
    if not text:
        return None
    try:
        return frozenset(int(r) for r in text.split(","))
    except ValueError:
        raise _bad("--local-ranks-filter", f"{text!r}: use local ranks like 0,1,2") from None


def _signals(text: str | None) -> tuple[str, ...]:
    if text is None:
        return DEFAULT_SIGNALS
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    for name in names:
        if not name.startswith("SIG") or not isinstance(getattr(signal, name, None), signal.Signals):
            raise _bad("--signals-to-handle", f"{name!r} is not a signal name (like SIGTERM)")
        if name in ("SIGKILL", "SIGSTOP", "SIGCHLD"):
            raise _bad("--signals-to-handle", f"{name} cannot be forwarded")
    if not names:
        raise _bad("--signals-to-handle", "give at least one signal, like SIGTERM")
    return names


def signal_numbers(names: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(int(getattr(signal, name)) for name in names)


def prefix_from_env(template: str, role: str) -> str:
    """TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE (``${rank}``, ``${local_rank}``, ``${role_name}``) as our
    --prefix template (``{rank}``, ``{local_rank}``); any other text is kept literally."""
    marks = {"rank": "\0r", "local_rank": "\0l"}
    text = string.Template(template).safe_substitute(marks, role_name=role)
    text = text.replace("{", "{{").replace("}", "}}")
    return text.replace(marks["rank"], "{rank}").replace(marks["local_rank"], "{local_rank}")


def compat_table_markdown() -> str:
    """The flag and variable tables of docs/torchrun-compat.md (a test keeps the doc equal to this)."""
    rows = ["| torchrun flag | variable | here |", "|---|---|---|"]
    for f in FLAGS:
        names = ", ".join(f"`{n}`" for n in f.torchrun)
        if f.ours:
            names += f" (ours: {', '.join(f'`{n}`' for n in f.ours)})"
        env = ", ".join(f"`{e}`" for e in f.env) or "-"
        rows.append(f"| {names} | {env} | {f.here} |")
    rows += ["", "| variable | here |", "|---|---|"]
    rows += [f"| `{name}` | {what} |" for name, what in OTHER_VARIABLES]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # regenerate the tables of docs/torchrun-compat.md
    print(compat_table_markdown(), end="")
