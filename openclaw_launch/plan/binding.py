"""CPU and memory binding: which CPUs and NUMA nodes each local worker gets, and the numactl argv.

Pure functions of the topology. The CPUs a GPU's worker may use are its NUMA
node's CPUs intersected with the CPUs this launcher may use (a cgroup or Slurm
cpuset can be narrower than the node), so the plan never asks for CPUs the
kernel would refuse.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from openclaw_launch.errors import PlanError
from openclaw_launch.topology.cpulist import format_cpulist
from openclaw_launch.topology.model import GpuInfo, Topology


@dataclass(frozen=True)
class Slot:
    """One local worker to place. ``gpu`` is the GPU it drives."""

    label: str  # names the worker in messages, e.g. "GPU 3 (GPU-...)"
    gpu: GpuInfo
    numa_node: int | None  # resolved: sysfs, else the config's value; None = unknown
    explicit_cpus: tuple[int, ...] | None = None  # GpuSpec.cpus (binding "explicit")


@dataclass(frozen=True)
class Binding:
    """Where one worker runs. ``applied`` False: no numactl prefix (binding ``none``)."""

    cpus: tuple[int, ...]
    mem_nodes: tuple[int, ...]
    cpu_nodes: tuple[int, ...] = ()  # cpus are exactly these whole NUMA nodes -> --cpunodebind
    applied: bool = True


@dataclass(frozen=True)
class BindingResult:
    bindings: tuple[Binding, ...]  # one per slot / worker, in order
    warnings: tuple[str, ...] = ()


def allowed_cpus(topology: Topology) -> tuple[int, ...]:
    """The CPUs workers may use. A topology without an allowed set (e.g. parsed from
    ``nvidia-smi`` text) allows every CPU it knows about."""
    if topology.allowed_cpus:
        return tuple(sorted(set(topology.allowed_cpus)))
    known: set[int] = set(topology.core_of)
    for cpus in topology.numa_nodes.values():
        known.update(cpus)
    for g in topology.gpus:
        known.update(g.cpu_affinity or ())
    return tuple(sorted(known))


def uses_numactl(policy: str) -> bool:
    """Whether ``run`` starts workers under numactl for ``runtime.binding`` ``policy``: every policy
    but ``none`` (which also leaves ``mem_policy`` unapplied). ``plan`` and ``validate`` both ask this."""
    return policy != "none"


def numactl_missing(policy: str, numactl: str | None) -> str | None:
    """What ``run`` does differently for want of numactl (None: nothing). The plan's warning and
    ``validate``'s numactl check are this one text."""
    if numactl is not None or not uses_numactl(policy):
        return None
    return (
        f"numactl is not installed: binding {policy} is not applied (workers run on all allowed CPUs "
        "and memory is not bound); install numactl, or set binding: none"
    )


def unbound(topology: Topology, n: int) -> tuple[Binding, ...]:
    """``n`` workers that run where the launcher may (binding ``none``, or no numactl)."""
    allowed = allowed_cpus(topology)
    return tuple(Binding(allowed, (), applied=False) for _ in range(n))


def cores_of(topology: Topology, cpus: Iterable[int]) -> list[tuple[int, ...]]:
    """Group ``cpus`` into physical cores (hyperthread siblings together), ordered by core.

    Without sibling information every CPU counts as its own core.
    """
    groups: dict[int, list[int]] = {}
    for c in sorted(set(cpus)):
        groups.setdefault(topology.core_of.get(c, c), []).append(c)
    return [tuple(groups[k]) for k in sorted(groups)]


def core_count(topology: Topology, cpus: Iterable[int]) -> int:
    """Distinct physical cores in ``cpus``, at least 1 (used for OMP_NUM_THREADS)."""
    return max(1, len(cores_of(topology, cpus)))


def numactl_argv(
    cpus: Sequence[int],
    mem_policy: str,
    mem_nodes: Sequence[int],
    numactl_path: str,
    cpu_nodes: Sequence[int] = (),
) -> list[str]:
    """The numactl prefix. ``cpu_nodes`` (whole NUMA nodes) -> ``--cpunodebind``, else
    ``--physcpubind``. No memory flag for bind/preferred when the NUMA node is unknown.
    ``preferred`` takes one node in numactl, so the first of ``mem_nodes`` is used."""
    argv = [numactl_path]
    if cpu_nodes:
        argv.append(f"--cpunodebind={_join(cpu_nodes)}")
    elif cpus:
        argv.append(f"--physcpubind={format_cpulist(cpus)}")
    if mem_policy == "bind" and mem_nodes:
        argv.append(f"--membind={_join(mem_nodes)}")
    elif mem_policy == "preferred" and mem_nodes:
        argv.append(f"--preferred={mem_nodes[0]}")
    elif mem_policy == "local":
        argv.append("--localalloc")
    return argv if len(argv) > 1 else []


def bind_gpu_workers(topology: Topology, slots: Sequence[Slot], policy: str) -> BindingResult:
    """Bindings for the GPU workers of one node, in slot order (deterministic)."""
    allowed = allowed_cpus(topology)
    warnings: list[str] = []
    if policy == "none":
        return BindingResult(unbound(topology, len(slots)))
    _require_cpus(allowed, topology, policy)
    no_numa = [s.label for s in slots if s.numa_node is None]
    if no_numa:
        warnings.append(
            f"no NUMA information for {', '.join(dict.fromkeys(no_numa))} on this host "
            "(sysfs numa_node is -1 and the config gives none): bound to the GPU's CPU affinity "
            "(or all allowed CPUs); memory is not bound"
        )
    homes = [_home(topology, s, allowed, warnings) for s in slots]
    if policy == "node":
        bindings = [Binding(cpus, mem, _whole_nodes(topology, cpus) if mem else ()) for cpus, mem in homes]
    elif policy == "exclusive":
        bindings = _exclusive(topology, slots, homes)
    elif policy == "socket":
        bindings = [_socket(topology, s, cpus, allowed) for s, (cpus, _) in zip(slots, homes, strict=True)]
    elif policy == "explicit":
        bindings = [_explicit(topology, s, allowed, warnings) for s in slots]
    else:
        raise PlanError(f"unknown binding policy {policy!r}; use one of: node, exclusive, socket, explicit, none")
    bindings = _within_allowed_mems(topology, bindings, [s.label for s in slots], warnings)
    return BindingResult(tuple(bindings), tuple(dict.fromkeys(warnings)))


def bind_cpu_workers(topology: Topology, n: int, policy: str) -> BindingResult:
    """Spread ``n`` CPU workers over the allowed CPUs in blocks of whole cores.

    With fewer cores than workers, every worker shares every allowed CPU.
    """
    allowed = allowed_cpus(topology)
    if policy == "none":
        return BindingResult(unbound(topology, n))
    _require_cpus(allowed, topology, policy)
    cores = cores_of(topology, allowed)
    warnings: list[str] = []
    if n > len(cores):
        warnings.append(
            f"{n} CPU workers but only {len(cores)} cores allowed: all workers share CPUs {format_cpulist(allowed)}"
        )
        shared = _within_allowed_mems(
            topology, [Binding(allowed, _single_node(topology, allowed))], ["the CPU workers"], warnings
        )
        return BindingResult(tuple(shared[0] for _ in range(n)), tuple(warnings))
    blocks = [tuple(sorted(c for core in part for c in core)) for part in _split(cores, n)]
    labels = [f"CPU worker {i}" for i in range(n)]
    bindings = _within_allowed_mems(topology, [Binding(b, _single_node(topology, b)) for b in blocks], labels, warnings)
    return BindingResult(tuple(bindings), tuple(dict.fromkeys(warnings)))


def _within_allowed_mems(
    topology: Topology, bindings: Sequence[Binding], labels: Sequence[str], warnings: list[str]
) -> list[Binding]:
    """Memory nodes the cpuset does not allow (``Mems_allowed``) are left out before they reach
    ``--membind``/``--preferred`` (numactl would fail there and the worker never start); a warning
    names them. Unknown allowed nodes (an old snapshot, nvidia-smi text): nothing is changed."""
    allowed = set(topology.allowed_mems)
    if not allowed:
        return list(bindings)
    out: list[Binding] = []
    for label, b in zip(labels, bindings, strict=True):
        kept = tuple(n for n in b.mem_nodes if n in allowed)
        if kept == b.mem_nodes:
            out.append(b)
            continue
        dropped = sorted(set(b.mem_nodes) - set(kept))
        then = f"memory goes to node(s) {_join(kept)}" if kept else "its memory is not bound"
        warnings.append(
            f"{label}: NUMA node(s) {_join(dropped)} are not among the memory nodes this launcher's cpuset "
            f"allows (Mems_allowed: {format_cpulist(sorted(allowed))}); {then}"
        )
        out.append(Binding(b.cpus, kept, b.cpu_nodes if kept else (), b.applied))
    return out


def _join(nodes: Iterable[int]) -> str:
    return ",".join(str(n) for n in nodes)


def _require_cpus(allowed: tuple[int, ...], topology: Topology, policy: str) -> None:
    if not allowed:
        raise PlanError(
            f"binding: {policy} needs the host's CPU list, but the topology ({topology.source}) has none; "
            "take a snapshot on the host with `openclaw-launch discover --snapshot`, or use binding: none"
        )


def _home(
    topology: Topology, slot: Slot, allowed: tuple[int, ...], warnings: list[str]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The CPUs local to the slot's GPU that may be used, and its memory node(s)."""
    mem = (slot.numa_node,) if slot.numa_node is not None else ()
    if slot.numa_node is not None and slot.numa_node in topology.numa_nodes:
        local: tuple[int, ...] = topology.numa_nodes[slot.numa_node]
    elif slot.gpu.cpu_affinity:
        local = slot.gpu.cpu_affinity
    elif slot.numa_node is not None:  # the node is known, but no CPU of it is (a Slurm cgroup, a VM)
        warnings.append(
            f"{slot.label}: this job has no CPUs on its NUMA node {slot.numa_node} (its CPU affinity is empty "
            f"within the cgroup/Slurm cpuset; allowed: {format_cpulist(allowed)}); its worker runs on the "
            "allowed CPUs and crosses the socket link"
        )
        return allowed, mem
    else:
        return allowed, mem
    cpus = tuple(sorted(set(local) & set(allowed)))
    if not cpus:
        warnings.append(
            f"{slot.label}: none of its local CPUs ({format_cpulist(local)}) are allowed to this launcher "
            f"(allowed: {format_cpulist(allowed)}, cgroup/Slurm cpuset); its worker runs on the allowed "
            "CPUs and crosses the socket link"
        )
        return allowed, mem
    return cpus, mem


def _whole_nodes(topology: Topology, cpus: tuple[int, ...]) -> tuple[int, ...]:
    """The NUMA nodes ``cpus`` consist of exactly, or () when they are not whole nodes."""
    wanted = set(cpus)
    nodes = sorted(n for n, ncpus in topology.numa_nodes.items() if wanted & set(ncpus))
    covered = {c for n in nodes for c in topology.numa_nodes[n]}
    return tuple(nodes) if nodes and covered == wanted else ()


def _single_node(topology: Topology, cpus: Iterable[int]) -> tuple[int, ...]:
    """The one NUMA node holding all ``cpus``, or () when they span nodes or it is unknown."""
    wanted = set(cpus)
    nodes = [n for n, ncpus in topology.numa_nodes.items() if wanted & set(ncpus)]
    return (nodes[0],) if len(nodes) == 1 and wanted <= set(topology.numa_nodes[nodes[0]]) else ()


def _split(items: Sequence[tuple[int, ...]], n: int) -> list[Sequence[tuple[int, ...]]]:
    """``n`` contiguous blocks whose sizes differ by at most one, larger blocks first."""
    q, r = divmod(len(items), n)
    out: list[Sequence[tuple[int, ...]]] = []
    start = 0
    for i in range(n):
        size = q + (1 if i < r else 0)
        out.append(items[start : start + size])
        start += size
    return out


def _exclusive(
    topology: Topology, slots: Sequence[Slot], homes: Sequence[tuple[tuple[int, ...], tuple[int, ...]]]
) -> list[Binding]:
    """Workers sharing a home CPU set split its whole cores; cores already given are not reused."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (cpus, _) in enumerate(homes):
        groups.setdefault(cpus, []).append(i)
    result: dict[int, Binding] = {}
    used: set[int] = set()
    for pool, members in groups.items():
        cores = [core for core in cores_of(topology, pool) if not used & set(core)]
        if len(members) > len(cores):
            where = _describe_pool(topology, slots[members[0]], pool)
            gpus = ", ".join(dict.fromkeys(slots[i].label for i in members))
            raise PlanError(
                f"binding: exclusive gives each worker whole cores, but {where} has {len(cores)} "
                f"allowed core(s) for {len(members)} worker(s) ({gpus}); use binding: node to let them "
                "share the node's CPUs, or run fewer workers per GPU"
            )
        for i, part in zip(members, _split(cores, len(members)), strict=True):
            cpus = tuple(sorted(c for core in part for c in core))
            used.update(cpus)
            result[i] = Binding(cpus, homes[i][1])
    return [result[i] for i in range(len(slots))]


def _describe_pool(topology: Topology, slot: Slot, pool: tuple[int, ...]) -> str:
    """The worker's CPUs for a message; says so when a cpuset left only part of its NUMA node."""
    if slot.numa_node is None:
        return f"CPUs {format_cpulist(pool)}"
    node_cpus = topology.numa_nodes.get(slot.numa_node, pool)
    if len(pool) < len(node_cpus):
        return (
            f"NUMA node {slot.numa_node} (CPUs {format_cpulist(pool)}: only {len(pool)} of its "
            f"{len(node_cpus)} CPUs are allowed to this launcher by its cgroup/Slurm cpuset)"
        )
    return f"NUMA node {slot.numa_node} (CPUs {format_cpulist(pool)})"


def _socket(topology: Topology, slot: Slot, home: tuple[int, ...], allowed: tuple[int, ...]) -> Binding:
    """All allowed CPUs of the socket the GPU's local CPUs sit on; memory on that socket's nodes."""
    sockets = [topology.socket_of[c] for c in home if c in topology.socket_of]
    if not sockets:
        raise PlanError(
            f"binding: socket needs the CPUs' sockets, but the topology ({topology.source}) does not say "
            f"which socket {slot.label} is on; use binding: node, or take a snapshot on the host with "
            "`openclaw-launch discover --snapshot`"
        )
    sock = sockets[0]
    cpus = tuple(c for c in allowed if topology.socket_of.get(c) == sock)
    mem = tuple(
        sorted(n for n, ncpus in topology.numa_nodes.items() if any(topology.socket_of.get(c) == sock for c in ncpus))
    )
    if not mem and slot.numa_node is not None:
        mem = (slot.numa_node,)
    return Binding(cpus, mem, _whole_nodes(topology, cpus) if mem else ())


def _explicit(topology: Topology, slot: Slot, allowed: tuple[int, ...], warnings: list[str]) -> Binding:
    """The configured CPU list, cut to the allowed CPUs (a warning names the ones dropped);
    memory on the nodes those CPUs are on."""
    if not slot.explicit_cpus:
        raise PlanError(
            f"binding: explicit needs a `cpus:` list for {slot.label} in the config; add one per GPU "
            "or use binding: node"
        )
    cpus = tuple(sorted(set(slot.explicit_cpus) & set(allowed)))
    if not cpus:
        raise PlanError(
            f"{slot.label}: none of its configured cpus ({format_cpulist(slot.explicit_cpus)}) are "
            f"allowed to this launcher (allowed: {format_cpulist(allowed)}, cgroup/Slurm cpuset); fix the "
            "`cpus:` list"
        )
    dropped = sorted(set(slot.explicit_cpus) - set(cpus))
    if dropped:
        warnings.append(
            f"{slot.label}: configured cpus {format_cpulist(dropped)} are not allowed to this launcher "
            f"(allowed: {format_cpulist(allowed)}, cgroup/Slurm cpuset); its worker runs on {format_cpulist(cpus)}"
        )
    mem = tuple(sorted(n for n, ncpus in topology.numa_nodes.items() if set(cpus) & set(ncpus)))
    if not mem and slot.numa_node is not None:
        mem = (slot.numa_node,)
    return Binding(cpus, mem)
