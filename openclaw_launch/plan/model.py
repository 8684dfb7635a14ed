"""The plan's types and their JSON (``openclaw-launch plan --json``, docs/plan-format.md): the
ranks, the MPS plan and the elastic range in the one codec (``codec.to_json``), field by field.

A plan holds everything ``run`` does to start this node's ranks: each rank's final argv and the
variables set on top of the inherited environment. ``build`` makes one, ``format`` prints it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from openclaw_launch.codec import to_json
from openclaw_launch.config.defaults import HANDLED_SIGNALS
from openclaw_launch.config.parallel import ParallelSpec
from openclaw_launch.plan.context import RunDir
from openclaw_launch.plan.parallel import ParallelLayout
from openclaw_launch.plan.prewarm import PrewarmPlan

PLAN_SCHEMA = 1

EntryKind = Literal["script", "module", "exec"]


@dataclass(frozen=True)
class Entry:
    """What each worker runs: ``python script args``, ``python -m module args`` or ``cmd args``."""

    kind: EntryKind
    target: str
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class ElasticRange:
    """An elastic job's node range (``--nnodes MIN:MAX``, ``runtime.min_nodes``/``max_nodes``): its
    plan is one world's, and ``run`` builds each world's own when the world's nodes meet."""

    min_nodes: int
    max_nodes: int


@dataclass(frozen=True)
class PlanOptions:
    """The command line's choices (the run's facts are the ``RunContext``)."""

    entry: Entry
    node: str | None = None  # which config node this launcher is; None = the only / first match
    python: str = "python3"  # interpreter for script/module entries (the launcher passes sys.executable)
    base_env: Mapping[str, str] = field(default_factory=dict)  # the launcher's environment (read-only)
    master_addr: str | None = None  # CLI overrides config
    master_port: int | None = None  # CLI overrides config; 0 (context.FREE_PORT): the free port, one node only
    max_restarts: int = 0
    numactl: str | None = "numactl"  # path to numactl; None = not installed (plan without it, warn)
    strictness: str | None = None  # CLI override of runtime.strictness
    telemetry_mode: str = "off"  # wire.TELEMETRY_MODES; "off" = no socket, no bootstrap (the CLI's default: hooks)
    hang_timeout_s: float | None = None  # --hang-timeout-s; None = the config's runtime.hang_timeout_s
    stats_interval_s: float | None = None  # --stats-interval-s (None: the default cadence): the workers' flush
    role: str = "default"  # ROLE_NAME (torchrun's --role)
    signals_to_handle: str = ",".join(HANDLED_SIGNALS)  # TORCHELASTIC_SIGNALS_TO_HANDLE
    virtual_local_rank: bool = False  # torchrun's --virtual-local-rank: LOCAL_RANK=0, only its own GPU
    parallel: ParallelSpec = field(default_factory=ParallelSpec)  # --tp/--pp/--dp (override the config's)
    fallback_master_addr: str | None = None  # several nodes, no address anywhere: Slurm's first host
    elastic: ElasticRange | None = None  # an elastic job: the plan is one world's
    prewarm: tuple[str, ...] = ()  # --prewarm (else runtime.prewarm): modules a zygote imports once (plan/prewarm.py)


@dataclass(frozen=True)
class RankPlan:
    rank: int
    local_rank: int
    node: str
    node_rank: int  # GROUP_RANK
    gpu_uuid: str | None  # None for CPU workers
    gpu_index: int | None
    pci_bus_id: str | None
    numa_node: int | None
    cpus: tuple[int, ...]
    mem_policy: str
    mem_nodes: tuple[int, ...]
    argv: tuple[str, ...]  # exactly what is executed
    env: Mapping[str, str]  # every variable the launcher sets on top of the inherited environment
    gpu_model: str | None = None  # its GPU's model as the host names it; None for CPU workers or unknown
    nic: str | None = None  # its NIC under runtime.nic_binding: nearest (in env as NCCL_IB_HCA/SOCKET_IFNAME)


@dataclass(frozen=True)
class MpsPlan:
    """The MPS daemon this node's launcher owns (runtime.enable_mps)."""

    max_clients_per_gpu: int | None
    active_thread_percentage: int | None
    pinned_device_mem_limit: str | None
    on_start_failure: str  # "error" | "warn"
    gpu_uuids: tuple[str, ...]


@dataclass(frozen=True)
class LaunchPlan:
    run_id: str
    node: str
    node_rank: int
    nnodes: int
    world_size: int
    master_addr: str
    master_port: int | None  # None: a one-node job's port that ``run`` finds free when it starts
    backend: str  # "nccl" or "gloo"
    ranks: tuple[RankPlan, ...]
    mps: MpsPlan | None = None
    warnings: tuple[str, ...] = ()
    telemetry_socket: str | None = None  # per-step statistics channel (telemetry.wire); None = off
    parallel: ParallelLayout | None = None  # TP/PP/DP groups (config parallel / --tp --pp --dp)
    hang_timeout_s: float | None = None  # hang detection (stats/hang.py); None = off
    elastic: ElasticRange | None = None  # an elastic job: this is one world's plan; None: the run's
    prewarm: PrewarmPlan | None = None  # the zygote that forks every worker (--prewarm); None: each is exec'd
    run_dir: RunDir = field(kw_only=True)  # the run's private directory and the paths in it

    def attempt_ranks(self, attempt: int) -> tuple[RankPlan, ...]:
        """The ranks as attempt N (0-based) starts them. The plan shows attempt 0's variables; two
        change per attempt, as under torchrun: TORCHELASTIC_RESTART_COUNT, and the run's error file
        of each rank (``RunDir.error_file``), so every attempt's survives the restart (a file given
        to a rank by hand stays as it is)."""
        out = []
        for rank in self.ranks:
            env = {**rank.env, "TORCHELASTIC_RESTART_COUNT": str(attempt)}
            if env.get("TORCHELASTIC_ERROR_FILE") == str(self.run_dir.error_file(rank.rank)):
                env["TORCHELASTIC_ERROR_FILE"] = str(self.run_dir.error_file(rank.rank, attempt))
            out.append(replace(rank, env=env))
        return tuple(out)

    def to_json(self) -> dict[str, object]:
        return {
            "schema": PLAN_SCHEMA,
            "run_id": self.run_id,
            "node": self.node,
            "node_rank": self.node_rank,
            "nnodes": self.nnodes,
            "world_size": self.world_size,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "backend": self.backend,
            "run_dir": str(self.run_dir.path),
            "mps": to_json(self.mps),
            "warnings": list(self.warnings),
            "telemetry_socket": self.telemetry_socket,
            "hang_timeout_s": self.hang_timeout_s,
            "parallel": self.parallel.to_json() if self.parallel is not None else None,
            "elastic": to_json(self.elastic),
            "prewarm": to_json(self.prewarm),
            "ranks": to_json(self.ranks),
        }
