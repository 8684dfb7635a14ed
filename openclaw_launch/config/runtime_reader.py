"""The ``runtime:`` section of a config: one reader per key of ``Runtime`` and the rules between keys
(NCCL thread counts against ``nccl_env``/``env``, MPS settings without MPS, deprecated variables)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import yaml

from openclaw_launch.config.defaults import LIGHTHOUSES, STRAGGLER_POLICIES
from openclaw_launch.config.model import (
    BINDING_POLICIES,
    MEM_POLICIES,
    MPS_ACTIVE_THREAD_RANGE,
    MPS_START_FAILURE_MODES,
    NCCL_DEPRECATED,
    NCCL_NAMED_LEVELS,
    NIC_BINDING_MODES,
    RUNTIME_KEYS,
    STRICTNESS_MODES,
    VISIBLE_DEVICES_MODES,
    Runtime,
    pinned_limit_problem,
    procs_per_gpu_problem,
)
from openclaw_launch.config.prewarm import prewarm_modules
from openclaw_launch.config.signals import parse_signals
from openclaw_launch.config.yaml_nodes import NAME_RE, Entry, NodeReader, given, is_null, join_path, kind_of, line_of
from openclaw_launch.limits import (
    MAX_ENV_VALUE,
    MAX_RANKS_PER_NODE,
    MAX_STRAGGLER_INTERVALS,
    MAX_WORLD_SIZE,
    MIN_HANG_TIMEOUT_S,
    MIN_STRAGGLER_INTERVALS,
    host_problem,
)

MPS_KEYS = tuple(k for k in RUNTIME_KEYS if k.startswith("mps_"))


class RuntimeReader(NodeReader):
    """Reads ``runtime:``; the document reader (``config/document.py``) builds on it."""

    def runtime(self, entry: Entry | None) -> tuple[Runtime, str | None]:
        """The Runtime and the binding policy the GPUs are checked against (None: invalid)."""
        if entry is None or is_null(entry.value):
            return Runtime(), "node"
        m = self.mapping(entry.value, entry.path, entry.line, RUNTIME_KEYS)
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
        self.check_elastic(runtime, m)
        self.check_straggler(runtime, m)
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
            "startup_timeout_s": lambda e: self.seconds(e, MIN_HANG_TIMEOUT_S),
            "nic_binding": lambda e: self.choice(e, NIC_BINDING_MODES),
            "prewarm": self.module_names,
            "min_nodes": lambda e: self.integer(e, 1, MAX_WORLD_SIZE),
            "max_nodes": lambda e: self.integer(e, 1, MAX_WORLD_SIZE),
            "standby_nodes": self.node_names,
            "exclude_file": self.text,
            "straggler_policy": lambda e: self.choice(e, STRAGGLER_POLICIES),
            "straggler_intervals": lambda e: self.integer(e, MIN_STRAGGLER_INTERVALS, MAX_STRAGGLER_INTERVALS),
            "straggler_exclude_pct": self.exclude_pct,
            "straggler_grace_s": lambda e: self.seconds(e, 0.0),
            "straggler_cooldown_intervals": lambda e: self.integer(e, 1, MAX_STRAGGLER_INTERVALS),
            "checkpoint_signal": self.one_signal,
            "replica_groups": lambda e: self.integer(e, 1, MAX_RANKS_PER_NODE),
            "lighthouse": lambda e: self.choice(e, LIGHTHOUSES),
        }

    def module_names(self, e: Entry) -> tuple[str, ...] | None:
        """``prewarm``: module names, a list or one string of names separated by commas (as ``--prewarm``)."""
        if isinstance(e.value, yaml.SequenceNode):
            items = self.sequence(e, "a list of module names") or []
            texts = [self.text(Entry(item, item, f"{e.path}[{k}]")) for k, item in enumerate(items)]
            text = None if any(t is None for t in texts) else ",".join(t for t in texts if t is not None)
        else:
            text = self.text(e, "module names")
        if text is None:
            return None
        try:
            return prewarm_modules(text)
        except ValueError as exc:
            self.error(e.path, e.line, str(exc))
            return None

    def node_names(self, e: Entry) -> tuple[str, ...] | None:
        """``standby_nodes``: a list of node names (checked against ``cluster.nodes`` with them)."""
        items = self.sequence(e, "a list of node names")
        if items is None:
            return None
        names = [self.text(Entry(item, item, f"{e.path}[{k}]")) for k, item in enumerate(items)]
        return None if any(n is None for n in names) else tuple(n for n in names if n is not None)

    def check_elastic(self, runtime: Runtime, m: dict[str, Entry]) -> None:
        """min_nodes and max_nodes come together, min below max; standby nodes only with them."""
        low, high = runtime.min_nodes, runtime.max_nodes
        where = m.get("min_nodes") or m.get("max_nodes") or m.get("standby_nodes")
        if where is None:
            return
        if (low is None) != (high is None):
            self.error(where.path, where.line, "min_nodes and max_nodes go together (an elastic job); give both")
        elif low is not None and high is not None and low >= high:
            self.error(where.path, where.line, f"min_nodes {low} must be below max_nodes {high} (elastic)")
        elif runtime.standby_nodes and low is None:
            self.error(where.path, where.line, "standby_nodes need an elastic job: give min_nodes and max_nodes")

    def check_straggler(self, runtime: Runtime, m: dict[str, Entry]) -> None:
        """``straggler_policy: exclude`` takes a node out of an elastic job: it needs min_nodes/max_nodes."""
        where = m.get("straggler_policy")
        if where is not None and runtime.straggler_policy == "exclude" and runtime.min_nodes is None:
            self.error(
                where.path,
                where.line,
                "exclude takes the straggler's node out of an elastic job: give min_nodes and max_nodes (with a "
                "standby in standby_nodes to keep the world's size), or use report (docs/elastic.md)",
            )

    def exclude_pct(self, e: Entry) -> float | None:
        """``straggler_exclude_pct``: above 0, at most 100 (% of the job's step)."""
        node = self.scalar(e.value, e.path, e.line, "a number above 0, at most 100", ("int", "float"))
        if node is None:
            return None
        try:
            value = float(str(node.value).replace("_", ""))
        except ValueError:
            value = math.nan
        if not 0 < value <= 100:
            self.error(e.path, e.line, f"expected a number above 0, at most 100 (% of the step), got {node.value!r}")
            return None
        return value

    def one_signal(self, e: Entry) -> str | None:
        """``checkpoint_signal``: one signal (config/signals.py's spellings), its canonical name."""
        text = self.text(e, "a signal name, like SIGUSR1")
        if text is None:
            return None
        try:
            names = parse_signals(text)
        except ValueError as err:
            self.error(e.path, e.line, str(err))
            return None
        if len(names) != 1:
            self.error(e.path, e.line, f"give one signal, not {len(names)}")
            return None
        return names[0]

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
        for key in MPS_KEYS:
            if given(m, key):
                self.warn(m[key].path, m[key].line, f"{key} has no effect without enable_mps: true")
