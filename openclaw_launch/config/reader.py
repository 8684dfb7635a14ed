"""YAML text -> validated ``Config`` (the format is documented in ``config``).

Walks PyYAML's node tree (safe composer only) so every problem carries its key
path and line, and reports all problems at once. The generic node reading (mappings, lists,
scalars, their messages) is ``yaml_nodes``'; the config's sections and their rules are here.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from openclaw_launch.config.limits import (
    MAX_CONFIG_BYTES,
    MAX_CPU_ID,
    MAX_ENV_VALUE,
    MAX_RANKS_PER_NODE,
    MIN_HANG_TIMEOUT_S,
    host_problem,
)
from openclaw_launch.config.model import (
    BINDING_POLICIES,
    MEM_POLICIES,
    MPS_ACTIVE_THREAD_RANGE,
    MPS_START_FAILURE_MODES,
    NCCL_DEPRECATED,
    NCCL_NAMED_LEVELS,
    PREFLIGHT_TIER_KINDS,
    RUNTIME_KEYS,
    STRICTNESS_MODES,
    VISIBLE_DEVICES_MODES,
    Config,
    GpuSpec,
    NodeSpec,
    PreflightSettings,
    Runtime,
    pinned_limit_problem,
    procs_per_gpu_problem,
)
from openclaw_launch.config.yaml_nodes import (
    NAME_RE,
    TAG,
    Y_CONSTRUCT,
    BoundedLoader,
    Entry,
    NodeReader,
    first_use,
    given,
    is_null,
    join_path,
    kind_of,
    line_of,
    mistyped,
    short_tag,
    syntax_problem,
)
from openclaw_launch.errors import ConfigError, Problem
from openclaw_launch.plan.parallel import PARALLEL_DIMS, ParallelSpec, node_rank_counts, size_problems
from openclaw_launch.safe_read import InputFileError, read_input
from openclaw_launch.topology.cpulist import parse_cpulist
from openclaw_launch.topology.model import normalize_bus_id

_TOP_KEYS = ("cluster", "runtime", "parallel", "preflight")
_PREFLIGHT_KEYS = ("expect_busbw_gbps", "size_mib", "iters")
_CLUSTER_KEYS = ("nodes",)
_NODE_KEYS = ("name", "ip", "gpus", "cpu_workers")
_GPU_KEYS = ("uuid", "numa_node", "pci_bus_id", "nvlink_peers", "cpus")
_RUNTIME_KEYS = RUNTIME_KEYS  # the fields of config.Runtime: one definition
_HOME: Mapping[str, str] = {
    **{k: "the top level" for k in _TOP_KEYS},
    **{k: "cluster" for k in _CLUSTER_KEYS},
    **{k: "a node (an item of cluster.nodes)" for k in _NODE_KEYS},
    **{k: "a GPU (an item of a node's gpus)" for k in _GPU_KEYS},
    **{k: "runtime" for k in _RUNTIME_KEYS},
    **{k: "parallel" for k in PARALLEL_DIMS},
    **{k: "preflight" for k in _PREFLIGHT_KEYS},
}
_MPS_KEYS = tuple(k for k in _RUNTIME_KEYS if k.startswith("mps_"))

_UUID_RE = re.compile(r"^(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)
_HOST_LABEL_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


def load_config_file(path: str | os.PathLike[str]) -> Config:
    """Read and validate the YAML file at ``path``; ConfigError lists every problem."""
    source = os.fspath(path)
    try:
        text = read_input(source, "config", MAX_CONFIG_BYTES)
    except InputFileError as e:
        reason = str(e).removeprefix(f"{source}: cannot read the config: ").removeprefix(f"{source}: ")
        raise ConfigError(source, [Problem("", None, f"cannot read the config: {reason}")]) from None
    return parse_config_text(text, source)


def parse_config_text(text: str, source: str = "<config>") -> Config:
    """Validate YAML ``text``; ``source`` names it in messages. Raises ConfigError."""
    try:
        root = yaml.compose(text, Loader=BoundedLoader)
    except yaml.YAMLError as e:
        raise ConfigError(source, [syntax_problem(e, text)]) from None
    checker = _Checker()
    config = checker.config(root, source)
    if checker.problems:
        raise ConfigError(source, sorted(checker.problems, key=lambda p: p.line or 0))
    return config


@dataclass
class _NodeScope:
    """What one node's GPUs are checked against each other with."""

    peers: list[tuple[str, str, int]] = field(default_factory=list)  # (uuid, path, line)
    bus_ids: dict[str, str] = field(default_factory=dict)  # bus id -> "path (line N)"


class _Checker(NodeReader):
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
        top = self.mapping(root, "", line_of(root), _TOP_KEYS, required=("cluster",)) or {}
        runtime, binding = self.runtime(top.get("runtime"))
        nodes = self.cluster(top.get("cluster"), binding)
        parallel = self.parallel(top.get("parallel"), nodes, runtime)
        preflight = self.preflight(top.get("preflight"))
        warnings = tuple(str(w) for w in sorted(self.warnings, key=lambda p: p.line or 0))
        return Config(
            nodes=nodes, runtime=runtime, parallel=parallel, preflight=preflight, source=source, warnings=warnings
        )

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
        m = self.mapping(entry.value, entry.path, entry.line, _PREFLIGHT_KEYS)
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
        m = self.mapping(entry.value, entry.path, entry.line, _CLUSTER_KEYS, required=("nodes",))
        if not m or "nodes" not in m:
            return ()
        items = self.sequence(m["nodes"], "a list of nodes")
        if items is None:
            return ()
        if not items:
            self.error(m["nodes"].path, m["nodes"].line, "the node list is empty; describe at least one node")
        return tuple(self.node(item, f"cluster.nodes[{i}]", binding) for i, item in enumerate(items))

    def node(self, item: yaml.Node, path: str, binding: str | None) -> NodeSpec:
        m = self.mapping(item, path, line_of(item), _NODE_KEYS, required=("name",))
        if m is None:
            return NodeSpec(name="")
        name = self.node_name(m["name"]) if "name" in m else None
        ip = self.ip(m["ip"]) if given(m, "ip") else None
        has_gpus, has_cpu = given(m, "gpus"), given(m, "cpu_workers")
        if has_gpus and has_cpu:
            e = m["cpu_workers"]
            self.error(e.path, e.line, "a node has either gpus or cpu_workers, not both; remove one")
        elif not has_gpus and not has_cpu and not mistyped(item, ("gpus", "cpu_workers"), _NODE_KEYS):
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
        m = self.mapping(item, path, line_of(item), _GPU_KEYS, required=("uuid",))
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

    # -- runtime ---------------------------------------------------------------------------

    def runtime(self, entry: Entry | None) -> tuple[Runtime, str | None]:
        """The Runtime and the binding policy the GPUs are checked against (None: invalid)."""
        if entry is None or is_null(entry.value):
            return Runtime(), "node"
        m = self.mapping(entry.value, entry.path, entry.line, _RUNTIME_KEYS)
        if m is None:
            return Runtime(), None
        readers = self.runtime_readers()
        values: dict[str, Any] = {}
        invalid: set[str] = set()
        for key, entry_ in m.items():
            if is_null(entry_.value):
                continue
            value = readers[key](entry_)
            if value is None:
                invalid.add(key)
            else:
                values[key] = value
        runtime = Runtime(**values)
        self.check_nccl(runtime, m)
        self.check_mps(runtime, m, invalid)
        return runtime, None if "binding" in invalid else runtime.binding

    def runtime_readers(self) -> dict[str, Callable[[Entry], Any]]:
        """One reader per ``RUNTIME_KEYS`` key (a test holds the two equal)."""
        return {
            "enable_mps": self.boolean,
            "mps_max_clients_per_gpu": lambda e: self.integer(e, 1, MAX_RANKS_PER_NODE),
            "mps_active_thread_percentage": lambda e: self.integer(e, *MPS_ACTIVE_THREAD_RANGE),
            "mps_pinned_device_mem_limit": self.mem_limit,
            "mps_on_start_failure": lambda e: self.choice(e, MPS_START_FAILURE_MODES),
            "nccl_socket_nthreads": lambda e: self.integer(e, 1, MAX_RANKS_PER_NODE),
            "nccl_nthreads": lambda e: self.integer(e, 1, MAX_RANKS_PER_NODE),
            "nccl_env": lambda e: self.env_mapping(e, nccl=True),
            "env": lambda e: self.env_mapping(e, nccl=False),
            "binding": lambda e: self.choice(e, BINDING_POLICIES),
            "mem_policy": lambda e: self.choice(e, MEM_POLICIES),
            "visible_devices": lambda e: self.choice(e, VISIBLE_DEVICES_MODES),
            "procs_per_gpu": lambda e: self.integer(e, 1, MAX_RANKS_PER_NODE),
            "master_addr": self.host,
            "master_port": lambda e: self.integer(e, 1, 65535),
            "strictness": lambda e: self.choice(e, STRICTNESS_MODES),
            "hang_timeout_s": lambda e: self.seconds(e, MIN_HANG_TIMEOUT_S),
        }

    def mem_limit(self, e: Entry) -> str | None:
        text = self.text(e, 'a size like "40G" or "512M"')
        if text is None:
            return None
        problem = pinned_limit_problem(text)
        if problem is not None:
            self.error(e.path, e.line, problem)
            return None
        return text

    def host(self, e: Entry) -> str | None:
        text = self.text(e, "an IP address or hostname")
        if text is None:
            return None
        problem = host_problem(text)
        if problem is not None:
            self.error(e.path, e.line, problem)
            return None
        return text

    def env_mapping(self, e: Entry, nccl: bool) -> dict[str, str] | None:
        """``nccl_env`` / ``env``: names checked, values kept as the literal YAML text."""
        v = e.value
        if not self.safe(v, e.path, e.line):
            return None
        if not isinstance(v, yaml.MappingNode):
            self.error(e.path, e.line, f"expected a mapping of NAME: value, got {kind_of(v)}")
            return None
        out: dict[str, str] = {}
        first_line: dict[str, int] = {}
        for key_node, value_node in v.value:
            key_line = line_of(key_node)
            if not isinstance(key_node, yaml.ScalarNode) or not self.safe(key_node, e.path, key_line):
                self.error(e.path, key_line, "keys must be plain variable names")
                continue
            name = str(key_node.value)
            ve = Entry(key_node, value_node, join_path(e.path, name))
            if name in first_line:
                self.error(ve.path, key_line, f"duplicate key {name!r} (first at line {first_line[name]})")
                continue
            first_line[name] = key_line
            if self.env_name(ve, name, nccl):
                value = self.env_value(ve)
                if value is not None:
                    out[name] = value
                    self.check_deprecated(ve, name, value)
        return out

    def env_name(self, e: Entry, name: str, nccl: bool) -> bool:
        if not NAME_RE.match(name):
            self.error(
                e.path,
                e.line,
                f"{name!r} is not a valid variable name (letters, digits and _, not starting with a digit)",
            )
            return False
        if nccl and not name.startswith("NCCL_"):
            self.error(e.path, e.line, f"{name!r} does not start with NCCL_; put other variables in runtime.env")
            return False
        return True

    def env_value(self, e: Entry) -> str | None:
        v = e.value
        if not self.safe(v, e.path, e.line):
            return None
        if not isinstance(v, yaml.ScalarNode) or is_null(v):
            empty = "; write '' for an empty value" if is_null(v) else ""
            self.error(e.path, e.line, f"expected a single value (string or number), got {kind_of(v)}{empty}")
            return None
        value = str(v.value)
        if "\0" in value:
            self.error(e.path, e.line, "an environment value cannot contain a NUL character")
            return None
        if len(value.encode()) > MAX_ENV_VALUE:
            self.error(
                e.path,
                e.line,
                f"{len(value.encode())} bytes: the kernel takes at most {MAX_ENV_VALUE} bytes per variable",
            )
            return None
        return value

    def check_deprecated(self, e: Entry, name: str, value: str) -> None:
        if name in NCCL_DEPRECATED:
            self.warn(e.path, e.line, f"{name} is deprecated: {NCCL_DEPRECATED[name]}")
        elif name in NCCL_NAMED_LEVELS and value.strip().isdigit():
            self.warn(
                e.path,
                e.line,
                f"{name}={value}: integer levels are deprecated (their meaning "
                f"changed between NCCL versions); use {NCCL_NAMED_LEVELS[name]}",
            )

    def check_nccl(self, rt: Runtime, m: dict[str, Entry]) -> None:
        """Operator keys vs ``nccl_env``/``env``; values NCCL itself would replace."""
        for key, var in (("nccl_socket_nthreads", "NCCL_SOCKET_NTHREADS"), ("nccl_nthreads", "NCCL_NTHREADS")):
            ours = getattr(rt, key)
            for where in ("nccl_env", "env"):
                theirs = getattr(rt, where).get(var)
                if ours is not None and theirs is not None and theirs.strip() != str(ours):
                    e = m[key]
                    self.error(
                        e.path,
                        e.line,
                        f"{key}: {ours} conflicts with runtime.{where}.{var}: {theirs!r}; set it in one place",
                    )
        for name in sorted(set(rt.env) & set(rt.nccl_env)):
            if rt.env[name] != rt.nccl_env[name]:
                e = m["env"]
                self.error(
                    e.path,
                    e.line,
                    f"{name} is set both in runtime.env ({rt.env[name]!r}) and "
                    f"runtime.nccl_env ({rt.nccl_env[name]!r}); set it in one place",
                )
        if rt.nccl_socket_nthreads is not None and rt.nccl_socket_nthreads > 16:
            e = m["nccl_socket_nthreads"]
            self.warn(
                e.path, e.line, f"NCCL caps NCCL_SOCKET_NTHREADS at 16; {rt.nccl_socket_nthreads} will be reduced"
            )
        nt = rt.nccl_nthreads
        if nt is not None and (nt % 32 or not 64 <= nt <= 512):
            e = m["nccl_nthreads"]
            self.warn(
                e.path,
                e.line,
                f"NCCL_NTHREADS={nt}: NCCL wants a multiple of 32 from 64 to 512 "
                "(CUDA threads per block) and will replace this value",
            )

    def check_mps(self, rt: Runtime, m: dict[str, Entry], invalid: set[str]) -> None:
        """Processes per GPU need MPS; MPS settings without MPS do nothing."""
        problem = procs_per_gpu_problem(rt.procs_per_gpu, rt.enable_mps, rt.mps_max_clients_per_gpu)
        if problem is not None and "procs_per_gpu" in m and "enable_mps" not in invalid:
            self.error(m["procs_per_gpu"].path, m["procs_per_gpu"].line, problem)
        if rt.enable_mps or "enable_mps" in invalid:
            return
        for key in _MPS_KEYS:
            if given(m, key):
                self.warn(m[key].path, m[key].line, f"{key} has no effect without enable_mps: true")


def _misplaced_hint(key: str) -> str:
    """Where a key that belongs elsewhere goes: usually an indentation mistake."""
    if key in _HOME:
        return f" {key!r} belongs in {_HOME[key]}; check the indentation."
    if key.startswith("NCCL_"):
        return f" NCCL variables go under runtime.nccl_env ({key}: ...)."
    if NAME_RE.match(key) and key.isupper():
        return f" Environment variables go under runtime.env ({key}: ...)."
    return ""
