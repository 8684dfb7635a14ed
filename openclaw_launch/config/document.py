"""A config document (composed YAML nodes) -> ``Config``: the top level, ``cluster`` (nodes, GPUs),
``parallel`` and ``preflight``; ``runtime`` is ``config/runtime_reader.py``'s. The generic node reading
(mappings, lists, scalars, their messages) is ``config/yaml_nodes.py``'s.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import yaml

from openclaw_launch.config.model import (
    PREFLIGHT_TIER_KINDS,
    RUNTIME_KEYS,
    Config,
    GpuSpec,
    NodeSpec,
    PreflightSettings,
    Runtime,
    node_rank_counts,
)
from openclaw_launch.config.parallel import PARALLEL_DIMS, ParallelSpec, size_problems
from openclaw_launch.config.runtime_reader import RuntimeReader
from openclaw_launch.config.yaml_nodes import (
    NAME_RE,
    TAG,
    Y_CONSTRUCT,
    Entry,
    first_use,
    given,
    is_null,
    join_path,
    line_of,
    mistyped,
    short_tag,
)
from openclaw_launch.limits import MAX_CPU_ID, MAX_RANKS_PER_NODE
from openclaw_launch.topology.cpulist import parse_cpulist
from openclaw_launch.topology.model import normalize_bus_id

#: The keys of each section, in the order of the reference in ``config/model.py`` (a test holds them).
TOP_KEYS = ("cluster", "runtime", "parallel", "preflight")
PREFLIGHT_KEYS = ("expect_busbw_gbps", "size_mib", "iters")
CLUSTER_KEYS = ("nodes",)
NODE_KEYS = ("name", "ip", "gpus", "cpu_workers")
GPU_KEYS = ("uuid", "numa_node", "pci_bus_id", "nvlink_peers", "cpus")
_HOME: Mapping[str, str] = {
    **{k: "the top level" for k in TOP_KEYS},
    **{k: "cluster" for k in CLUSTER_KEYS},
    **{k: "a node (an item of cluster.nodes)" for k in NODE_KEYS},
    **{k: "a GPU (an item of a node's gpus)" for k in GPU_KEYS},
    **{k: "runtime" for k in RUNTIME_KEYS},
    **{k: "parallel" for k in PARALLEL_DIMS},
    **{k: "preflight" for k in PREFLIGHT_KEYS},
}

_UUID_RE = re.compile(r"^(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)


@dataclass
class _NodeScope:
    """What one node's GPUs are checked against each other with."""

    peers: list[tuple[str, str, int]] = field(default_factory=list)  # (uuid, path, line)
    bus_ids: dict[str, str] = field(default_factory=dict)  # bus id -> "path (line N)"


class ConfigChecker(RuntimeReader):
    """Walks the composed node tree once, collecting every problem and warning."""

    def __init__(self) -> None:
        super().__init__()
        self.uuids: dict[str, str] = {}  # lower-case UUID -> where first seen
        self.names: dict[str, str] = {}
        self.ips: dict[ipaddress.IPv4Address | ipaddress.IPv6Address, str] = {}

    def misplaced_hint(self, key: str) -> str:
        return _misplaced_hint(key)

    # -- the document ----------------------------------------------------------------------

    def config(self, root: yaml.Node | None, source: str) -> Config:
        if is_null(root):
            self.error("cluster", 1, "the config is empty; it needs 'cluster' with 'nodes'")
            return Config(nodes=(), source=source)
        assert root is not None
        top = self.mapping(root, "", line_of(root), TOP_KEYS, required=("cluster",)) or {}
        runtime, binding = self.runtime(top.get("runtime"))
        nodes = self.cluster(top.get("cluster"), binding)
        parallel = self.parallel(top.get("parallel"), nodes, runtime)
        self.elastic_nodes(top.get("runtime"), nodes, runtime)
        preflight = self.preflight(top.get("preflight"))
        warnings = tuple(str(w) for w in sorted(self.warnings, key=lambda p: p.line or 0))
        return Config(
            nodes=nodes, runtime=runtime, parallel=parallel, preflight=preflight, source=source, warnings=warnings
        )

    def elastic_nodes(self, entry: Entry | None, nodes: tuple[NodeSpec, ...], rt: Runtime) -> None:
        """An elastic job's sizes and standbys against the nodes listed."""
        line = entry.line if entry is not None else None
        names = [n.name for n in nodes]
        if rt.max_nodes is not None and nodes and rt.max_nodes > len(nodes):
            self.error("runtime.max_nodes", line, f"{rt.max_nodes}, but cluster.nodes lists {len(nodes)}")
        for name in rt.standby_nodes:
            if nodes and name not in names:
                self.error("runtime.standby_nodes", line, f"{name!r} is not in cluster.nodes ({', '.join(names)})")
        if rt.standby_nodes and nodes and nodes[0].name in rt.standby_nodes:
            self.error("runtime.standby_nodes", line, f"{nodes[0].name!r} is the first node: it hosts the rendezvous")

    def parallel(self, entry: Entry | None, nodes: tuple[NodeSpec, ...], rt: Runtime) -> ParallelSpec:
        """``parallel: {tp, pp, dp}``; the sizes are checked against the nodes with the plan's rule."""
        if entry is None or is_null(entry.value):
            return ParallelSpec()
        m = self.mapping(entry.value, entry.path, entry.line, PARALLEL_DIMS)
        if m is None:
            return ParallelSpec()
        sizes = {k: self.integer(e, 1) for k, e in m.items() if not is_null(e.value)}
        spec = ParallelSpec(**sizes, where={k: f"parallel.{k}" for k in PARALLEL_DIMS})
        if self.problems or any(v is None for v in sizes.values()):
            return spec  # the nodes or sizes are already wrong: a size check would only add noise
        ranks = node_rank_counts(nodes, rt.procs_per_gpu)
        for problem in size_problems(spec, sum(ranks.values()), ranks):
            self.error(entry.path, entry.line, problem)
        return spec

    def preflight(self, entry: Entry | None) -> PreflightSettings:
        if entry is None or is_null(entry.value):
            return PreflightSettings()
        m = self.mapping(entry.value, entry.path, entry.line, PREFLIGHT_KEYS)
        if m is None:
            return PreflightSettings()
        expect: dict[str, float] = {}
        if given(m, "expect_busbw_gbps"):
            e = m["expect_busbw_gbps"]
            kinds = self.mapping(e.value, e.path, e.line, PREFLIGHT_TIER_KINDS) or {}
            for kind, ke in kinds.items():
                node = self.scalar(ke.value, ke.path, ke.line, "a bandwidth in GB/s (a number > 0)", ("int", "float"))
                if node is None:
                    continue
                read = Y_CONSTRUCT.construct_yaml_int if short_tag(node) == "int" else Y_CONSTRUCT.construct_yaml_float
                value = float(read(node))
                if not 0 < value < float("inf"):
                    self.error(ke.path, ke.line, f"{node.value} is not a bandwidth: expected GB/s > 0")
                else:
                    expect[kind] = value
        size = self.integer(m["size_mib"], 1) if given(m, "size_mib") else None
        iters = self.integer(m["iters"], 1) if given(m, "iters") else None
        return PreflightSettings(expect_busbw_gbps=expect, size_mib=size, iters=iters)

    def cluster(self, entry: Entry | None, binding: str | None) -> tuple[NodeSpec, ...]:
        if entry is None:
            return ()
        m = self.mapping(entry.value, entry.path, entry.line, CLUSTER_KEYS, required=("nodes",))
        if not m or "nodes" not in m:
            return ()
        items = self.sequence(m["nodes"], "a list of nodes")
        if items is None:
            return ()
        if not items:
            self.error(m["nodes"].path, m["nodes"].line, "the node list is empty; describe at least one node")
        return tuple(self.node(item, f"cluster.nodes[{i}]", binding) for i, item in enumerate(items))

    def node(self, item: yaml.Node, path: str, binding: str | None) -> NodeSpec:
        m = self.mapping(item, path, line_of(item), NODE_KEYS, required=("name",))
        if m is None:
            return NodeSpec(name="")
        name = self.node_name(m["name"]) if "name" in m else None
        ip = self.ip(m["ip"]) if given(m, "ip") else None
        has_gpus, has_cpu = given(m, "gpus"), given(m, "cpu_workers")
        if has_gpus and has_cpu:
            e = m["cpu_workers"]
            self.error(e.path, e.line, "a node has either gpus or cpu_workers, not both; remove one")
        elif not has_gpus and not has_cpu and not mistyped(item, ("gpus", "cpu_workers"), NODE_KEYS):
            self.error(path, line_of(item), "a node needs gpus (a list of GPUs) or cpu_workers: N")
        cpu_workers = self.integer(m["cpu_workers"], 1, MAX_RANKS_PER_NODE) if has_cpu else None
        gpus = self.gpus(m["gpus"], binding) if has_gpus else ()
        return NodeSpec(name=name or "", ip=ip, gpus=gpus, cpu_workers=cpu_workers, line=line_of(item))

    def node_name(self, e: Entry) -> str | None:
        name = self.text(e, "a node name")
        if name is None:
            return None
        if not name or any(c.isspace() or c == "/" or not c.isprintable() for c in name):
            self.error(
                e.path,
                e.line,
                f"node name {name!r} must be non-empty, without spaces or '/' "
                "(it names log files and is given to --node)",
            )
            return None
        if first := first_use(self.names, name, e):
            self.error(e.path, e.line, f"duplicate node name {name!r}; {first} already uses it")
        return name

    def ip(self, e: Entry) -> str | None:
        text = self.text(e, "an IP address")
        if text is None:
            return None
        try:
            addr = ipaddress.ip_address(text.strip())
        except ValueError:
            self.error(
                e.path,
                e.line,
                f"{text!r} is not an IP address (e.g. 10.10.1.10 or fd00::1); hostnames are not allowed here",
            )
            return None
        if first := first_use(self.ips, addr, e):
            self.warn(
                e.path,
                e.line,
                f"same IP as {first}: several agents on one host is how multi-node is tried locally; "
                "on a real cluster this is a mistake",
            )
        return text.strip()

    def gpus(self, e: Entry, binding: str | None) -> tuple[GpuSpec, ...]:
        items = self.sequence(e, "a list of GPUs")
        if items is None:
            return ()
        if not items:
            self.error(e.path, e.line, "the GPU list is empty; list the node's GPUs or use cpu_workers: N")
        scope = _NodeScope()
        specs = tuple(self.gpu(g, f"{e.path}[{i}]", binding, scope) for i, g in enumerate(items))
        own = {g.uuid.lower() for g in specs}
        for uuid, ppath, pline in scope.peers:
            if uuid.lower() not in own:
                self.warn(ppath, pline, f"NVLink peer {uuid} is not a GPU of this node in the config")
        return specs

    def gpu(self, item: yaml.Node, path: str, binding: str | None, scope: _NodeScope) -> GpuSpec:
        m = self.mapping(item, path, line_of(item), GPU_KEYS, required=("uuid",))
        if m is None:
            return GpuSpec(uuid="")
        uuid = self.uuid(m["uuid"]) if "uuid" in m else None
        if uuid is not None and (first := first_use(self.uuids, uuid.lower(), m["uuid"])):
            self.error(m["uuid"].path, m["uuid"].line, f"duplicate GPU UUID {uuid}; {first} already names it")
        numa = self.numa_node(m["numa_node"]) if given(m, "numa_node") else None
        bus = self.bus_id(m["pci_bus_id"]) if given(m, "pci_bus_id") else None
        if bus is not None and (first := first_use(scope.bus_ids, bus, m["pci_bus_id"])):
            e = m["pci_bus_id"]
            self.error(e.path, e.line, f"bus id {bus} is already used by {first} on this node")
        peer_list = self.nvlink_peers(m["nvlink_peers"], uuid) if given(m, "nvlink_peers") else ()
        scope.peers.extend(peer_list)
        cpus = self.cpus(m["cpus"], binding) if given(m, "cpus") else None
        if binding == "explicit" and not given(m, "cpus"):
            self.error(
                join_path(path, "cpus"),
                line_of(item),
                "runtime.binding is 'explicit': every GPU needs "
                'cpus (a cpulist like "0-7,64-71" or a list of CPU numbers)',
            )
        return GpuSpec(
            uuid=uuid or "",
            numa_node=numa,
            pci_bus_id=bus,
            nvlink_peers=tuple(u for u, _, _ in peer_list),
            cpus=cpus,
            line=line_of(item),
        )

    def uuid(self, e: Entry) -> str | None:
        text = self.text(e, "a GPU UUID")
        if text is None:
            return None
        if not _UUID_RE.match(text):
            self.error(
                e.path,
                e.line,
                f"malformed GPU UUID {text!r}: expected "
                "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (hex digits; MIG- for MIG instances), "
                "as printed by nvidia-smi -L"
                + (" (GPU indexes change between boots; name GPUs by UUID)" if text.isdigit() else ""),
            )
            return None
        return text

    def numa_node(self, e: Entry) -> int | None:
        v = e.value
        if isinstance(v, yaml.ScalarNode) and v.tag == TAG + "int" and v.value.strip().startswith("-"):
            self.error(
                e.path,
                e.line,
                f"NUMA node {v.value} is negative; write null when the host has "
                "no NUMA information (sysfs numa_node -1)",
            )
            return None
        return self.integer(e, 0, MAX_CPU_ID)

    def bus_id(self, e: Entry) -> str | None:
        text = self.text(e, 'a PCI bus id like "0000:0a:00.0"')
        if text is None:
            return None
        try:
            return normalize_bus_id(text)
        except ValueError:
            self.error(
                e.path,
                e.line,
                f'malformed PCI bus id {text!r}: expected e.g. "0000:0a:00.0" '
                "(domain:bus:device.function, hex; see nvidia-smi --query-gpu=pci.bus_id)",
            )
            return None

    def nvlink_peers(self, e: Entry, own: str | None) -> tuple[tuple[str, str, int], ...]:
        items = self.sequence(e, "a list of GPU UUIDs")
        if items is None:
            return ()
        out = []
        for i, item in enumerate(items):
            pe = Entry(item, item, f"{e.path}[{i}]")
            uuid = self.uuid(pe)
            if uuid is None:
                continue
            if own is not None and uuid.lower() == own.lower():
                self.error(pe.path, pe.line, "a GPU is not its own NVLink peer; remove it")
                continue
            out.append((uuid, pe.path, pe.line))
        return tuple(out)

    def cpus(self, e: Entry, binding: str | None) -> tuple[int, ...] | None:
        if binding not in (None, "explicit"):
            self.error(
                e.path,
                e.line,
                f"cpus is only used with runtime.binding: explicit (binding is "
                f"{binding!r}); remove it or set binding: explicit",
            )
            return None
        if isinstance(e.value, yaml.SequenceNode):
            return self.cpu_items(e)
        text = self.text(e, 'a cpulist like "0-7,64-71" or a list of CPU numbers')
        if text is None:
            return None
        try:
            cpus = parse_cpulist(text)
        except ValueError as err:
            self.error(e.path, e.line, str(err))
            return None
        if not cpus:
            self.error(e.path, e.line, "the CPU list is empty")
            return None
        return cpus

    def cpu_items(self, e: Entry) -> tuple[int, ...] | None:
        items = self.sequence(e, "a list of CPU numbers")
        if not items:
            if items is not None:
                self.error(e.path, e.line, "the CPU list is empty")
            return None
        cpus = [self.integer(Entry(n, n, f"{e.path}[{i}]"), 0, MAX_CPU_ID) for i, n in enumerate(items)]
        if any(c is None for c in cpus):
            return None
        return tuple(sorted({c for c in cpus if c is not None}))


def _misplaced_hint(key: str) -> str:
    """Where a key that belongs elsewhere goes: usually an indentation mistake."""
    if key in _HOME:
        return f" {key!r} belongs in {_HOME[key]}; check the indentation."
    if key.startswith("NCCL_"):
        return f" NCCL variables go under runtime.nccl_env ({key}: ...)."
    if NAME_RE.match(key) and key.isupper():
        return f" Environment variables go under runtime.env ({key}: ...)."
    return ""
