"""Config + Topology + RunContext + options -> LaunchPlan. Pure: no I/O, no clock, no os.environ.

Everything the launcher will do to start a rank is decided here, each rank's final argv and
environment included, and can be printed (``openclaw-launch plan``, ``plan/format.py``) before
anything runs: ``run`` executes exactly this.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from openclaw_launch.config.checks import identity_checks, planned_numa_node
from openclaw_launch.config.defaults import MASTER_PORT
from openclaw_launch.config.model import Config, GpuSpec, NodeSpec, node_rank_counts, procs_per_gpu_problem
from openclaw_launch.config.parallel import size_problems
from openclaw_launch.errors import PlanError, TopologyError
from openclaw_launch.plan.binding import (
    Binding,
    BindingResult,
    Slot,
    bind_cpu_workers,
    bind_gpu_workers,
    core_count,
    numactl_argv,
    numactl_missing,
    unbound,
)
from openclaw_launch.plan.context import FREE_PORT, NODE_RANK_PLACEHOLDER, RunContext
from openclaw_launch.plan.env import JobEnv, RankSlot, overridden_user_vars, rank_env, visible_devices
from openclaw_launch.plan.model import Entry, LaunchPlan, MpsPlan, PlanOptions, RankPlan
from openclaw_launch.plan.nics import plan_nics
from openclaw_launch.plan.parallel import ParallelLayout, layout_warnings, plan_parallel
from openclaw_launch.plan.prewarm import prewarm_plan
from openclaw_launch.telemetry import wire
from openclaw_launch.topology.model import GpuInfo, Topology
from openclaw_launch.topology.nic import NicChoice

DEFAULT_MASTER_ADDR = "127.0.0.1"


@dataclass(frozen=True)
class _ResolvedGpu:
    """A configured GPU found on the host, with the NUMA node the plan uses."""

    spec: GpuSpec
    gpu: GpuInfo
    numa_node: int | None


def build_plan(config: Config, topology: Topology, context: RunContext, options: PlanOptions) -> LaunchPlan:
    """Everything this node's launcher will do, decided up front. Deterministic."""
    node_rank, node = _select_node(config, options.node)
    runtime = config.runtime
    warnings: list[str] = list(config.warnings)
    _check_procs_per_gpu(config)
    if node.is_cpu:
        resolved: tuple[_ResolvedGpu, ...] = ()
        result = bind_cpu_workers(topology, _workers(config, node), runtime.binding)
    else:
        resolved, found = _resolve(config, node_rank, topology, options)
        warnings += found
        result = bind_gpu_workers(topology, _slots(resolved, runtime.procs_per_gpu), runtime.binding)
    warnings += result.warnings
    nics, nic_warnings = plan_nics(runtime, node, [r.gpu for r in resolved], topology, options.base_env)
    warnings += nic_warnings
    if numactl_missing(runtime.binding, options.numactl):  # run cannot apply it: the plan says so
        result = BindingResult(unbound(topology, len(result.bindings)))
    warnings += _policy_warnings(config, node, options)
    layout = _parallel(config, options)
    if layout is not None:
        warnings += layout_warnings(layout, config)
    mps = _mps(config, resolved) if runtime.enable_mps and not node.is_cpu else None
    socket = str(context.run_dir.socket) if options.telemetry_mode != "off" else None
    hang_timeout_s = options.hang_timeout_s if options.hang_timeout_s is not None else runtime.hang_timeout_s
    if hang_timeout_s and socket is None:
        warnings.append("--telemetry off: no progress from the workers, so hang detection is off")
    job = JobEnv(
        run_id=context.run_id,
        world_size=sum(_workers(config, n) for n in config.nodes),
        nnodes=len(config.nodes),
        master_addr=_master_addr(config, options),
        master_port=_master_port(config, context, options),
        runtime=runtime,
        run_dir=context.run_dir,
        role=options.role,
        signals_to_handle=options.signals_to_handle,
        base_env=options.base_env,
        max_restarts=options.max_restarts,
        telemetry_socket=socket,
        telemetry_mode=options.telemetry_mode,
        hang_detection=bool(hang_timeout_s) and socket is not None,
        flush_interval_s=wire.flush_interval_s(options.stats_interval_s),
        mps=mps is not None,
        parallel=layout,
    )
    warnings += _shell_rendezvous_warnings(options.base_env, job.master_addr, job.master_port)
    entry = _entry_argv(options.entry, options.python, job)
    modules = options.prewarm or runtime.prewarm  # the flag wins over the config
    prewarm = prewarm_plan(modules, options.entry.kind, entry) if modules else None
    if context.by_arrival and context.free_master_port is None:
        warnings.append(
            f"node rank {NODE_RANK_PLACEHOLDER} (c10d without --node-rank): this is node rank 0's plan; run takes "
            "the rank the rendezvous gives in order of arrival (RANK, GROUP_RANK and the node's name follow) and "
            "builds the plan then; MASTER_PORT is node rank 0's free port"
        )
    return LaunchPlan(
        run_id=context.run_id,
        node=node.name,
        node_rank=node_rank,
        nnodes=job.nnodes,
        world_size=job.world_size,
        master_addr=job.master_addr,
        master_port=job.master_port,
        backend="gloo" if node.is_cpu else "nccl",
        ranks=_ranks(config, node_rank, topology, options, entry, job, resolved, result, nics),
        mps=mps,
        warnings=tuple(dict.fromkeys(warnings)),
        telemetry_socket=socket,
        parallel=layout,
        hang_timeout_s=hang_timeout_s if job.hang_detection else None,
        elastic=options.elastic,
        prewarm=prewarm,
        run_dir=context.run_dir,
    )


def _parallel(config: Config, options: PlanOptions) -> ParallelLayout | None:
    """The TP/PP/DP layout when one is asked for (config, then the flags size by size)."""
    spec = config.parallel.overridden_by(options.parallel)
    if not spec.given:
        return None
    ranks = node_rank_counts(config.nodes, config.runtime.procs_per_gpu)
    problems = size_problems(spec, sum(ranks.values()), ranks)
    if problems:
        raise PlanError("; ".join(problems))
    return plan_parallel(config, spec)


def _master_addr(config: Config, options: PlanOptions) -> str:
    """Flag, config, the first node's ip, Slurm's first host; 127.0.0.1 only for one node (several
    nodes that each met at their own 127.0.0.1 would hang, each waiting for itself)."""
    given = options.master_addr or config.runtime.master_addr or config.nodes[0].ip or options.fallback_master_addr
    if given:
        return given
    if len(config.nodes) > 1:
        raise PlanError(
            f"{len(config.nodes)} nodes but no address for the first node ({config.nodes[0].name}): give it an "
            "ip in the config, or runtime.master_addr, or --master-addr (under Slurm the first allocated host "
            "is used)"
        )
    return DEFAULT_MASTER_ADDR


def _master_port(config: Config, context: RunContext, options: PlanOptions) -> int | None:
    """A given port wins (flag, then config; $MASTER_PORT is not read, as by torchrun). Otherwise,
    or for port 0, a one-node job takes the free port the launcher found (two jobs on one host must
    not collide, as under torchrun; None: found when ``run`` starts), and a multi-node job the fixed
    default every node computes alike."""
    if options.master_port == FREE_PORT and len(config.nodes) > 1:
        raise PlanError(
            f"MASTER_PORT 0 (a free port) is for one node: the {len(config.nodes)} nodes must all be given the "
            "same port (--master-port PORT, --rdzv-endpoint HOST:PORT or runtime.master_port)"
        )
    given = options.master_port if options.master_port is not None else config.runtime.master_port
    if given:
        return given
    if len(config.nodes) == 1 or context.by_arrival:
        return context.free_master_port
    return MASTER_PORT


def _shell_rendezvous_warnings(base_env: Mapping[str, str], master_addr: str, master_port: int | None) -> list[str]:
    """torchrun's rule: MASTER_ADDR and MASTER_PORT of the launching shell are not read (PET_* and
    the flags are); one warning where the workers get other values than the shell exports."""
    planned = {"MASTER_ADDR": master_addr, "MASTER_PORT": None if master_port is None else str(master_port)}
    ignored = [k for k, v in planned.items() if k in base_env and base_env[k] != v]
    if not ignored:
        return []
    given = " and ".join(f"{k}={base_env[k]}" for k in ignored)
    instead = " and ".join(f"--{k.lower().replace('_', '-')} (or PET_{k})" for k in ignored)
    verb, them = ("is", "it") if len(ignored) == 1 else ("are", "them")
    return [f"{given} of the launching environment {verb} ignored, as by torchrun; to choose {them} use {instead}"]


def _select_node(config: Config, name: str | None) -> tuple[int, NodeSpec]:
    if name is None:
        if len(config.nodes) != 1:
            names = ", ".join(n.name for n in config.nodes)
            raise PlanError(
                f"{config.source} has {len(config.nodes)} nodes ({names}); say which one this is with --node NAME"
            )
        return 0, config.nodes[0]
    node = config.node(name)
    return config.nodes.index(node), node


def _workers(config: Config, node: NodeSpec) -> int:
    if node.cpu_workers is not None:
        return node.cpu_workers
    return len(node.gpus) * config.runtime.procs_per_gpu


def _check_procs_per_gpu(config: Config) -> None:
    rt = config.runtime
    problem = procs_per_gpu_problem(rt.procs_per_gpu, rt.enable_mps, rt.mps_max_clients_per_gpu)
    if problem is not None:
        raise PlanError(f"runtime.{problem}")


def _where(node_rank: int, index: int, spec: GpuSpec) -> str:
    path = f"cluster.nodes[{node_rank}].gpus[{index}]"
    return f"{path} (line {spec.line})" if spec.line is not None else path


def _resolve(
    config: Config, node_rank: int, topology: Topology, options: PlanOptions
) -> tuple[tuple[_ResolvedGpu, ...], list[str]]:
    """Configured UUID -> GPU on the host. Missing GPUs are fatal; mismatches fail or warn
    per strictness. Returns the GPUs and the warnings."""
    node = config.nodes[node_rank]
    found = [topology.gpu_by_uuid(spec.uuid) for spec in node.gpus]
    missing = [
        f"  {_where(node_rank, i, s)}: {s.uuid}"
        for i, (s, g) in enumerate(zip(node.gpus, found, strict=True))
        if g is None
    ]
    if missing:
        raise TopologyError(
            f"{len(missing)} GPU(s) of node {node.name} in {config.source} are not on this host "
            f"({topology.source}):\n"
            + "\n".join(missing)
            + "\nGPUs on this host:\n"
            + topology.describe_gpus()
            + "\nFix the uuids in the config, or run `openclaw-launch discover` here to write a matching config."
        )
    resolved: list[_ResolvedGpu] = []
    mismatches: list[str] = []
    warnings: list[str] = []
    for i, (spec, gpu) in enumerate(zip(node.gpus, found, strict=True)):
        assert gpu is not None
        where = _where(node_rank, i, spec)
        for check in identity_checks(spec, gpu, topology):  # the rules validate applies too
            if check.outcome == "mismatch":
                mismatches.append(f"{where}: {check.problem}")
            elif check.name == "numa_node" and check.outcome == "unknown":
                warnings.append(f"{where}: {check.problem}; using the config's numa_node {spec.numa_node}")
        resolved.append(_ResolvedGpu(spec, gpu, planned_numa_node(spec, gpu)))
    strictness = options.strictness or config.runtime.strictness
    if mismatches and strictness == "fail":
        raise TopologyError(
            f"node {node.name} in {config.source} does not match this host ({topology.source}):\n"
            + "\n".join(f"  {m}" for m in mismatches)
            + "\nFix the config (or run `openclaw-launch discover` here), or set runtime.strictness: warn "
            "to launch anyway."
        )
    return tuple(resolved), mismatches + warnings


def _slots(resolved: Sequence[_ResolvedGpu], procs_per_gpu: int) -> list[Slot]:
    """One slot per worker: GPU j's workers are local ranks j*k .. j*k+k-1."""
    return [
        Slot(f"GPU {r.gpu.index} ({r.gpu.uuid})", r.gpu, r.numa_node, r.spec.cpus)
        for r in resolved
        for _ in range(procs_per_gpu)
    ]


def _policy_warnings(config: Config, node: NodeSpec, options: PlanOptions) -> list[str]:
    rt = config.runtime
    out: list[str] = []
    missing = numactl_missing(rt.binding, options.numactl)
    if missing:
        out.append(missing)
    ignored = overridden_user_vars(rt)
    if ignored:
        out.append(f"the launcher sets {', '.join(ignored)} itself; the config's values are ignored")
    if not node.is_cpu and rt.procs_per_gpu > 1 and rt.visible_devices == "ordered":
        out.append(
            f"procs_per_gpu {rt.procs_per_gpu}: cuda:LOCAL_RANK is not each rank's GPU; scripts must use "
            f"OPENCLAW_CUDA_DEVICE_INDEX (= LOCAL_RANK // {rt.procs_per_gpu})"
        )
    return out


BOOTSTRAP_MODULE = "openclaw_launch.telemetry.bootstrap"


def _entry_argv(entry: Entry, python: str, job: JobEnv) -> list[str]:
    """-u as torchrun: a killed worker's last output is not lost in its stdio buffer. With the
    hooks on, Python entries run through the bootstrap, which leaves sys.argv as it is."""
    if entry.kind == "exec":
        return [entry.target, *entry.args]
    target = [entry.target] if entry.kind == "script" else ["-m", entry.target]
    hooked = job.telemetry_socket is not None and job.telemetry_mode in ("full", "hooks")
    front = ["-m", BOOTSTRAP_MODULE] if hooked else []
    return [python, "-u", *front, *target, *entry.args]


def _prefix(binding: Binding, mem_policy: str, numactl: str | None) -> list[str]:
    if not binding.applied or numactl is None:
        return []
    return numactl_argv(binding.cpus, mem_policy, binding.mem_nodes, numactl, binding.cpu_nodes)


def _ranks(
    config: Config,
    node_rank: int,
    topology: Topology,
    options: PlanOptions,
    entry: Sequence[str],
    job: JobEnv,
    resolved: Sequence[_ResolvedGpu],
    result: BindingResult,
    nics: Mapping[int, NicChoice],
) -> tuple[RankPlan, ...]:
    node = config.nodes[node_rank]
    rt = config.runtime
    offset = sum(_workers(config, n) for n in config.nodes[:node_rank])
    k = rt.procs_per_gpu
    uuids = [r.gpu.uuid or r.spec.uuid for r in resolved]
    out: list[RankPlan] = []
    # Ranks bound to the same CPUs split their cores for OMP_NUM_THREADS, or N ranks would each
    # start a thread per core and oversubscribe the node N times.
    sharing = Counter(b.cpus for b in result.bindings)
    devices_mode = "isolated" if options.virtual_local_rank else rt.visible_devices
    for local, binding in enumerate(result.bindings):
        # bind/preferred with no memory node (unknown, or not allowed by the cpuset) binds nothing
        nodes_needed = rt.mem_policy in ("bind", "preferred")
        mem_policy = rt.mem_policy if binding.applied and (binding.mem_nodes or not nodes_needed) else "none"
        gpu = resolved[local // k] if resolved else None
        uuid = uuids[local // k] if gpu else None
        cvd, index = visible_devices(devices_mode, uuids, uuid) if uuid else ("", None)
        numa = gpu.numa_node if gpu else (binding.mem_nodes[0] if len(binding.mem_nodes) == 1 else None)
        nic = nics.get(gpu.gpu.index) if gpu else None
        slot = RankSlot(
            rank=offset + local,
            local_rank=local,
            local_world_size=len(result.bindings),
            node=node.name,
            node_rank=node_rank,
            cpus=binding.cpus,
            cores=max(1, core_count(topology, binding.cpus) // sharing[binding.cpus]),
            gpu_uuid=uuid,
            pci_bus_id=gpu.gpu.pci_bus_id if gpu else None,
            numa_node=numa,
            cuda_visible_devices=cvd,
            cuda_device_index=index,
            nic=(nic.nic.kind, nic.nic.name) if nic else None,
        )
        env = rank_env(job, slot)
        if options.virtual_local_rank:  # each worker sees one device, as cuda:0
            env["LOCAL_RANK"] = "0"
        out.append(
            RankPlan(
                rank=slot.rank,
                local_rank=local,
                node=node.name,
                node_rank=node_rank,
                gpu_uuid=uuid,
                gpu_index=gpu.gpu.index if gpu else None,
                pci_bus_id=slot.pci_bus_id,
                numa_node=numa,
                cpus=binding.cpus,
                mem_policy=mem_policy,
                mem_nodes=binding.mem_nodes if mem_policy != "none" else (),
                argv=(*_prefix(binding, mem_policy, options.numactl), *entry),
                env=env,
                gpu_model=gpu.gpu.name if gpu else None,
                nic=nic.nic.name if nic else None,
            )
        )
    return tuple(out)


def _mps(config: Config, resolved: Sequence[_ResolvedGpu]) -> MpsPlan:
    rt = config.runtime
    return MpsPlan(
        max_clients_per_gpu=rt.mps_max_clients_per_gpu,
        active_thread_percentage=rt.mps_active_thread_percentage,
        pinned_device_mem_limit=rt.mps_pinned_device_mem_limit,
        on_start_failure=rt.mps_on_start_failure,
        gpu_uuids=tuple(r.gpu.uuid or r.spec.uuid for r in resolved),
    )
