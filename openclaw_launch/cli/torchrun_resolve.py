"""torchrun's flag values (``torchrun_compat.TorchrunArgs``) -> what the planner and the supervisor
need. No I/O except ``free_port``: ``plan`` and ``run`` read a torchrun command line alike, and a
refused value raises ``click.BadParameter`` naming the option, before anything starts.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import click

from openclaw_launch.agents.membership import ElasticSpec
from openclaw_launch.cli.torchrun_compat import TorchrunArgs
from openclaw_launch.config.defaults import HANDLED_SIGNALS, LAST_CALL_TIMEOUT_S, RDZV_PORT
from openclaw_launch.config.model import Config
from openclaw_launch.limits import MAX_PREFIX_LEN, MAX_RANKS_PER_NODE, MAX_WORLD_SIZE, host_problem
from openclaw_launch.plan.context import FREE_PORT

_STD_STREAMS = {0: (), 1: ("stdout",), 2: ("stderr",), 3: ("stdout", "stderr")}  # torchrun's Std


@dataclass(frozen=True)
class Resolved:
    """What the torchrun flags ask of the planner and the supervisor."""

    nproc_per_node: int | str | None  # N, "gpu", "cpu", "auto", or None (our default)
    nnodes: int | None  # None: not given; elastic: MIN (what ``plan`` shows)
    elastic: ElasticSpec | None  # --nnodes MIN:MAX with MIN < MAX (c10d, node ranks by the rendezvous)
    last_call_timeout_s: float  # --rdzv-conf last_call_timeout: an elastic job's first world waits this for more
    node_rank: int | None
    master_addr: str | None
    master_port: int | None  # FREE_PORT (0): a free port drawn at start (torchrun's port 0, --standalone)
    by_arrival: bool  # c10d, several nodes, no --node-rank: node ranks by arrival at the endpoint
    binding: str | None  # overrides runtime.binding
    signals: tuple[str, ...]  # forwarded, by canonical name
    console_hidden: frozenset[tuple[int, str]]  # (local rank, stream) kept off the console (--redirects less --tee)
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
    last_call_timeout_s = _rdzv_conf(args.rdzv_conf)
    nodes_range = _nnodes(args.nnodes)
    nnodes = nodes_range[0] if nodes_range else None
    elastic = None
    if nodes_range is not None and nodes_range[0] != nodes_range[1]:
        elastic = ElasticSpec(nodes_range[0], nodes_range[1], last_call_timeout_s)
    backend = args.rdzv_backend or "static"
    if backend not in ("static", "c10d"):
        raise _bad(
            "--rdzv-backend",
            f"{backend}: elastic rendezvous is not done here; every node gets a fixed rank: "
            "--nnodes N --node-rank K (static or c10d), or --config",
        )
    if args.standalone and (nnodes or 1) > 1:
        raise _bad("--standalone", f"is a single-node job, but --nnodes is {nnodes}")
    if elastic is not None:
        _check_elastic(args, backend, with_config)
    several = (nnodes or 1) > 1 or elastic is not None
    by_arrival = backend == "c10d" and several and args.node_rank is None and not with_config
    if by_arrival and not args.rdzv_endpoint:
        raise _bad("--rdzv-endpoint", "c10d ranks the nodes at the rendezvous: give HEAD:PORT (the first node's host)")
    if args.node_rank is not None and nnodes is not None and args.node_rank >= nnodes:
        raise _bad("--node-rank", f"{args.node_rank} but --nnodes is {nnodes} (ranks are 0..{nnodes - 1})")
    if args.node_rank is not None and nnodes is None and args.node_rank > 0 and not with_config:
        raise _bad("--node-rank", f"{args.node_rank} needs --nnodes (the number of nodes)")
    addr, port = args.master_addr, args.master_port
    if args.rdzv_endpoint and not args.standalone:
        addr, port = _endpoint(args.rdzv_endpoint)
        if host_problem(addr):
            raise _bad("--rdzv-endpoint", f"{host_problem(addr)}; use HOST[:PORT]")
        if by_arrival and port == FREE_PORT:
            raise _bad(
                "--rdzv-endpoint", f"{args.rdzv_endpoint}: port 0 is for one node; every node must meet on one port"
            )
    elif addr is not None and host_problem(addr):
        raise _bad("--master-addr", f"{host_problem(addr)}; use an IP address or hostname")
    if args.standalone:  # torchrun's --standalone: a free port, whatever --master-port says
        port = FREE_PORT
    redirected = _streams(args.redirects, "--redirects")
    teed = _streams(args.tee, "--tee")
    return Resolved(
        nproc_per_node=_nproc(args.nproc_per_node),
        nnodes=nnodes,
        elastic=elastic,
        last_call_timeout_s=last_call_timeout_s,
        node_rank=args.node_rank,
        master_addr=addr,
        master_port=port,
        by_arrival=by_arrival,
        binding=args.numa_binding,
        signals=args.signals_to_handle or HANDLED_SIGNALS,
        console_hidden=_console_hidden(redirected, teed),
        wants_logs=bool(redirected or teed),
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
    if not 1 <= n <= MAX_RANKS_PER_NODE:
        raise _bad("--nproc-per-node", f"{n}: use a number 1..{MAX_RANKS_PER_NODE}, gpu, cpu or auto")
    return n


def _nnodes(text: str | None) -> tuple[int, int] | None:
    """``N``, ``N:N`` or ``MIN:MAX`` -> (MIN, MAX)."""
    if text is None:
        return None
    low, _, high = text.partition(":")
    try:
        lo, hi = int(low), int(high or low)
    except ValueError:
        raise _bad("--nnodes", f"{text!r}: use N, or MIN:MAX (elastic), in numbers") from None
    if not (1 <= lo <= MAX_WORLD_SIZE and 1 <= hi <= MAX_WORLD_SIZE):
        raise _bad("--nnodes", f"{text}: use N (or MIN:MAX) in 1..{MAX_WORLD_SIZE}")
    if lo > hi:
        raise _bad("--nnodes", f"{text}: MIN {lo} is above MAX {hi}; use MIN:MAX with MIN <= MAX")
    return lo, hi


def _check_elastic(args: TorchrunArgs, backend: str, with_config: bool) -> None:
    """``--nnodes MIN:MAX`` runs on the agents' own rendezvous: torchrun's c10d line only."""
    if with_config:
        raise _bad(
            "--nnodes",
            f"{args.nnodes}: elastic membership is torchrun's command line here (c10d, no --config); with --config "
            "give the config's node count",
        )
    if backend != "c10d":
        raise _bad("--nnodes", f"{args.nnodes}: elastic membership needs --rdzv-backend c10d and --rdzv-endpoint")
    if args.node_rank is not None:
        raise _bad("--node-rank", f"{args.node_rank}: with --nnodes {args.nnodes} the rendezvous gives the node ranks")
    if not args.rdzv_endpoint:
        raise _bad(
            "--rdzv-endpoint", "elastic membership meets at a rendezvous: give HEAD:PORT (the first node's host)"
        )


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
        return host, RDZV_PORT
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise _bad("--rdzv-endpoint", f"{text!r}: the port must be 0..65535 (0: a free port, one node only)")
    return host, int(port)


def script_args(after_target: tuple[str, ...]) -> tuple[str, ...]:
    """The target's arguments as torchrun passes them: one ``--`` directly after the script (or
    ``-m`` module, or ``--no-python`` command) is dropped (argparse's end of options), any other
    ``--`` is the script's (``train.py a -- b`` keeps it)."""
    return after_target[1:] if after_target[:1] == ("--",) else after_target


def _rdzv_conf(text: str | None) -> float:
    """torchrun's ``--rdzv-conf KEY=VALUE,...``: ``last_call_timeout`` (seconds) is used (elastic:
    how long the first world waits for more nodes once MIN are there); the other keys are checked
    for their form only. Returns the last-call timeout."""
    last_call_timeout_s = LAST_CALL_TIMEOUT_S
    for item in filter(None, (text or "").split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise _bad("--rdzv-conf", f"{item!r}: use KEY=VALUE,KEY=VALUE")
        if key.strip() == "last_call_timeout":
            try:
                last_call_timeout_s = float(value)
            except ValueError:
                last_call_timeout_s = -1.0
            if not 0 <= last_call_timeout_s <= 86400:
                raise _bad("--rdzv-conf", f"last_call_timeout={value!r}: use seconds 0..86400")
    return last_call_timeout_s


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


def _console_hidden(
    redirected: frozenset[tuple[int, str]], teed: frozenset[tuple[int, str]]
) -> frozenset[tuple[int, str]]:
    """The (local rank or -1 = all, stream) pairs kept off the console: redirected and not teed, as
    torchrun has it (its tee is a redirect plus a tail of the log, so tee wins, per stream and local
    rank). Where a per-rank mapping meets a single value, every local rank is listed."""
    named = any(rank != -1 for rank, _ in redirected | teed)
    ranks = range(MAX_RANKS_PER_NODE) if named else (-1,)

    def covers(pairs: frozenset[tuple[int, str]], rank: int, stream: str) -> bool:
        return bool({(rank, stream), (-1, stream)} & pairs)

    return frozenset(
        (rank, stream)
        for rank in ranks
        for stream in _STD_STREAMS[3]
        if covers(redirected, rank, stream) and not covers(teed, rank, stream)
    )


def _local_ranks(text: str | None) -> frozenset[int] | None:
    if not text:
        return None
    try:
        return frozenset(int(r) for r in text.split(","))
    except ValueError:
        raise _bad("--local-ranks-filter", f"{text!r}: use local ranks like 0,1,2") from None


def prefix_from_env(template: str, role: str) -> str:
    """TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE (``${rank}``, ``${local_rank}``, ``${role_name}``) as our
    --prefix template (``{rank}``, ``{local_rank}``); any other text is kept literally."""
    marks = {"rank": "\0r", "local_rank": "\0l"}
    text = string.Template(template).safe_substitute(marks, role_name=role)
    text = text.replace("{", "{{").replace("}", "}}")
    return text.replace(marks["rank"], "{rank}").replace(marks["local_rank"], "{local_rank}")


PREFIX_FIELDS = ("rank", "local_rank", "node", "attempt")


def check_prefix(template: str, option: str = "--prefix") -> str:
    """A console prefix template: text and the fields ``{rank}``, ``{local_rank}``, ``{node}``,
    ``{attempt}`` only (no format specs: ``{rank:>99999999}`` is not a prefix), at most
    ``MAX_PREFIX_LEN`` characters. Checked before anything starts."""
    fields = ", ".join(f"{{{f}}}" for f in PREFIX_FIELDS)
    if len(template) > MAX_PREFIX_LEN:
        raise _bad(option, f"{len(template)} characters; at most {MAX_PREFIX_LEN}")
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise _bad(option, f"{template!r}: {e} (fields: {fields}; write {{{{ for a literal brace)") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in PREFIX_FIELDS or spec or conversion:
            shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise _bad(option, f"{template!r}: {shown} is not a field; use {fields} (write {{{{ for a literal brace)")
    return template


# The sockets that hold this launcher's free ports (see ``free_port``), open until it exits.
def node_by_rank(config: Config, nnodes: int | None, node_rank: int | None, cli_node: str | None) -> str | None:
    """``--node-rank K`` with ``--config``: the config's K-th node; None without it (``--nnodes``,
    when given, must match the config either way)."""
    if nnodes is not None and nnodes != len(config.nodes):
        raise click.BadParameter(f"{nnodes} but {config.source} has {len(config.nodes)} node(s)", param_hint="--nnodes")
    if node_rank is None:
        return None
    if node_rank >= len(config.nodes):
        raise click.BadParameter(
            f"{node_rank} but {config.source} has {len(config.nodes)} node(s)", param_hint="--node-rank"
        )
    name = config.nodes[node_rank].name
    if cli_node is not None and cli_node != name:
        raise click.UsageError(f"--node {cli_node} and --node-rank {node_rank} ({name}) name different nodes")
    return name


def misspelled_command(word: str, commands: tuple[str, ...], is_file: bool) -> str | None:
    """The command ``word`` was probably meant to be (``vaildate``), unless it is a file to run."""
    if word.startswith("-") or is_file:  # an option or a script: every run's first word, no difflib
        return None
    import difflib

    close = difflib.get_close_matches(word, commands, n=1, cutoff=0.7)
    return close[0] if close else None
