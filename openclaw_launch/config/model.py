"""The typed ``Config`` and the reference of its YAML keys (``config/reader.py`` loads a file).

The operators' format (``cluster.nodes[].gpus[]``, ``runtime.*``) is accepted
unchanged; our extensions sit beside those keys. Every problem names its key
path and YAML line, all problems are reported at once, and nothing is started
before the config is known to be good (exit code 2).

Reference (every key; ``*`` = required)::

    cluster:*
      nodes:*                   list of hosts, ranks are numbered node by node in this order
        - name:*                unique node name (``--node NAME``); no spaces or '/'
          ip:                   IP address of the host (no hostnames); several nodes may share one
                                IP (a warning): that is how multi-node is tried on one machine
          gpus:                 the GPUs to use, in local-rank order (exactly one of gpus/cpu_workers)
            - uuid:*            GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx or MIG-<same shape>
                                (``nvidia-smi -L``); any case, unique in the whole cluster
              numa_node:        integer >= 0, or null when the host has no NUMA information
                                (sysfs says -1); checked against the machine by ``validate``
              pci_bus_id:       e.g. "0000:0a:00.0" (NVML's 00000000:0A:00.0 and any case accepted;
                                quote it)
              nvlink_peers:     list of UUIDs this GPU has NVLink to (a peer that is not a GPU of
                                the same node is a warning)
              cpus:             only with ``runtime.binding: explicit`` (then on every GPU):
                                a cpulist "0-7,64-71" or a list of CPU numbers
          cpu_workers:          N >= 1 CPU-only workers, for a node without GPUs
    runtime:                    job-wide, identical for every rank on every node
      enable_mps:               true/false (default false): run the node's NVIDIA MPS daemon
      mps_max_clients_per_gpu:  integer >= 1
      mps_active_thread_percentage: 1..100 (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)
      mps_pinned_device_mem_limit:  per-GPU pinned memory limit for MPS clients, e.g. "40G", "512M"
      mps_on_start_failure:     error (default) | warn: what to do when the MPS daemon cannot start
      nccl_socket_nthreads:     integer >= 1 -> NCCL_SOCKET_NTHREADS (NCCL caps it at 16)
      nccl_nthreads:            integer >= 1 -> NCCL_NTHREADS (NCCL wants a multiple of 32, 64..512)
      nccl_env:                 mapping NCCL_* -> value, set for every rank
      env:                      mapping NAME -> value of other variables, set for every rank
                                (the launcher's own per-rank ones, e.g. RANK, win: the plan warns)
      binding:                  node (default) | exclusive | socket | explicit | none
      mem_policy:               bind (default) | preferred | local | none
      visible_devices:          ordered (default: all node GPUs by UUID, cuda:LOCAL_RANK is the
                                rank's GPU) | isolated (only the rank's own UUID)
      procs_per_gpu:            integer >= 1 (default 1); > 1 needs enable_mps and at most
                                mps_max_clients_per_gpu
      master_addr:              IP address or hostname of rank 0's node
      master_port:              1..65535 (``--master-port`` overrides it)
      strictness:               fail (default) | warn: how bus-id / NUMA / NVLink-peer mismatches
                                against the live machine are treated
      hang_timeout_s:           seconds (2 .. a week; default off): a rank with no step for this long
                                is a hang: named, its stack dumped, the job stopped with exit code 124
                                (``--hang-timeout-s`` overrides it; docs/hangs-and-metrics.md)
      startup_timeout_s:        seconds (2 .. a week; default with a hang timeout: the larger of it
                                and 600): a rank without a first step this long after the start is
                                a hang (``--startup-timeout-s`` overrides it)
      nic_binding:              none (default: NCCL picks its NICs) | nearest: each GPU rank gets the
                                NIC nearest its GPU on PCIe (same switch, else host bridge, else
                                NUMA node) as NCCL_IB_HCA (RDMA) or NCCL_SOCKET_IFNAME (Ethernet);
                                no NIC found: a warning, and NCCL picks (topology/nic.py)
      prewarm:                  module names, a list or "torch,numpy": a zygote imports them once and
                                forks every worker (``--prewarm`` overrides it; docs/plan-format.md)
      min_nodes:                integer, with max_nodes (1 <= min_nodes < max_nodes <= the nodes
                                listed): an elastic job (docs/elastic.md): it starts once min_nodes
                                of the config's nodes are there, and re-forms when one is lost or arrives
      max_nodes:                integer, with min_nodes: the most nodes of one world
      standby_nodes:            list of node names (elastic only): they run no ranks until a node is
                                lost, then take its node rank (as ``--standby``)
      exclude_file:             path (elastic only): each node the job takes out for good is added to
                                this file's Slurm hostlist (as ``--exclude-file``; docs/elastic.md)
      straggler_policy:         none | report (default) | exclude: what the job-wide live verdict's
                                straggler costs its node; exclude needs min_nodes/max_nodes
                                (``--on-straggler``; docs/elastic.md)
      straggler_intervals:      integer >= 2 (default 3): exclude: live intervals in a row one node
                                must be named the job's straggler (``--straggler-intervals``)
      straggler_exclude_pct:    number above 0, at most 100 (default 10): exclude: its excess as % of
                                the job's step in each (``--straggler-exclude-pct``)
      straggler_grace_s:        seconds (default 30): exclude: from the checkpoint request to the
                                workers' stop (``--straggler-grace-s``)
      straggler_cooldown_intervals: integer >= 1 (default 10): exclude: at most one exclusion per this
                                many live intervals (``--straggler-cooldown-intervals``)
      checkpoint_signal:        a signal name (default SIGUSR1): exclude: the workers' checkpoint
                                request (``--checkpoint-signal``)
      replica_groups:           integer >= 1 (one node): torchft's replica groups, K worlds of the
                                node's ranks and their lighthouse (``--replica-groups`` overrides it;
                                docs/replica-groups.md)
      lighthouse:               openclaw or torchft (default: openclaw where grpcio and protobuf are
                                installed): whose lighthouse joins the replica groups (``--lighthouse``)
    parallel:                   tensor / pipeline / data parallel layout (``--tp/--pp/--dp`` override
                                each); workers get OPENCLAW_{TP,PP,DP}_{RANK,SIZE} and the groups
      tp:                       integer >= 1 (default 1): TP group size; divides every node's ranks
                                (a TP group stays on one node, on NVLink-joined GPUs per nvlink_peers)
      pp:                       integer >= 1 (default 1): pipeline stages
      dp:                       integer >= 1 (default: world size / (tp * pp)); tp*pp*dp = world size
    preflight:                  ``openclaw-launch preflight`` (docs/preflight.md)
      expect_busbw_gbps:        mapping tier kind -> all-reduce bus bandwidth floor in GB/s, replacing
                                the default derived from the hardware; kinds: nvlink (each NVLink
                                island), node (all of the node's ranks)
      size_mib:                 integer >= 1 (default 1024; CPU ranks default to 4): all-reduce size
      iters:                    integer >= 1 (default 20): timed all-reduces per tier

Environment values (``nccl_env``, ``env``) are taken exactly as written in the
YAML (``0.10`` stays "0.10", ``yes`` stays "yes") and reach the workers
literally: nothing is ever interpreted by a shell, so ``$(...)``, ``;``, quotes
and newlines are just characters. Deprecated NCCL variables give warnings
(see ``NCCL_DEPRECATED``). An empty value (``key:`` or ``null``) for an
optional key means "not set". Only plain (safe) YAML is accepted: no
``!!python/...`` or other tags, no ``<<`` merge keys, no duplicate keys.
Errors read ``cluster.nodes[1].gpus[0].uuid (line 14): ...``; YAML syntax errors
use the path ``yaml``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Literal

from openclaw_launch.config.parallel import ParallelSpec

BindingPolicy = Literal["node", "exclusive", "socket", "explicit", "none"]
MemPolicy = Literal["bind", "preferred", "local", "none"]
VisibleDevices = Literal["ordered", "isolated"]
Strictness = Literal["fail", "warn"]
MpsStartFailure = Literal["error", "warn"]
NicBinding = Literal["none", "nearest"]
StragglerPolicy = Literal["none", "report", "exclude"]  # config/defaults.STRAGGLER_POLICIES

BINDING_POLICIES: tuple[str, ...] = ("node", "exclusive", "socket", "explicit", "none")
MEM_POLICIES: tuple[str, ...] = ("bind", "preferred", "local", "none")
VISIBLE_DEVICES_MODES: tuple[str, ...] = ("ordered", "isolated")
STRICTNESS_MODES: tuple[str, ...] = ("fail", "warn")
MPS_START_FAILURE_MODES: tuple[str, ...] = ("error", "warn")
NIC_BINDING_MODES: tuple[str, ...] = ("none", "nearest")
# What `set_default_device_pinned_mem_limit` accepts: an integer followed by M or G.
PINNED_MEM_LIMIT_RE = re.compile(r"[1-9][0-9]*[MG]")


@dataclass(frozen=True)
class GpuSpec:
    """One configured GPU. ``pci_bus_id`` is normalised (``0000:0a:00.0``, lower case)."""

    uuid: str
    numa_node: int | None = None
    pci_bus_id: str | None = None
    nvlink_peers: tuple[str, ...] = ()
    cpus: tuple[int, ...] | None = None  # explicit CPU list (binding "explicit")
    line: int | None = None


@dataclass(frozen=True)
class NodeSpec:
    """One host. Exactly one of ``gpus`` (non-empty) or ``cpu_workers`` is set."""

    name: str
    ip: str | None = None
    gpus: tuple[GpuSpec, ...] = ()
    cpu_workers: int | None = None
    line: int | None = None

    @property
    def is_cpu(self) -> bool:
        return self.cpu_workers is not None


@dataclass(frozen=True)
class Runtime:
    """Job-wide settings, identical for every rank on every node."""

    enable_mps: bool = False
    mps_max_clients_per_gpu: int | None = None
    mps_active_thread_percentage: int | None = None  # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
    mps_pinned_device_mem_limit: str | None = None  # e.g. "40G" -> per-device pinned limit
    mps_on_start_failure: MpsStartFailure = "error"
    nccl_socket_nthreads: int | None = None  # -> NCCL_SOCKET_NTHREADS
    nccl_nthreads: int | None = None  # -> NCCL_NTHREADS
    nccl_env: Mapping[str, str] = field(default_factory=dict)  # NCCL_* for all ranks
    env: Mapping[str, str] = field(default_factory=dict)  # any other variables for all ranks
    binding: BindingPolicy = "node"
    mem_policy: MemPolicy = "bind"
    visible_devices: VisibleDevices = "ordered"
    procs_per_gpu: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    strictness: Strictness = "fail"  # bus-id / NUMA / NVLink-peer mismatches
    hang_timeout_s: float | None = None  # --hang-timeout-s; None = off
    startup_timeout_s: float | None = None  # --startup-timeout-s; None = defaults.startup_timeout_s
    nic_binding: NicBinding = "none"  # "nearest": each GPU rank's NIC (topology/nic.py, plan/env.py)
    prewarm: tuple[str, ...] = ()  # --prewarm: modules a zygote imports once (plan/prewarm.py)
    min_nodes: int | None = None  # elastic (agents/elastic.py): with max_nodes
    max_nodes: int | None = None
    standby_nodes: tuple[str, ...] = ()  # elastic: nodes that wait to replace a lost one
    exclude_file: str | None = None  # elastic: --exclude-file (cli/exclude.py)
    # --on-straggler and its knobs (agents/straggler_policy.py); None: the option's, else config/defaults.py's
    straggler_policy: StragglerPolicy | None = None
    straggler_intervals: int | None = None
    straggler_exclude_pct: float | None = None
    straggler_grace_s: float | None = None
    straggler_cooldown_intervals: int | None = None
    checkpoint_signal: str | None = None  # a canonical name (config/signals.py)
    replica_groups: int | None = None  # --replica-groups: torchft's replica groups (plan/replica_groups.py)
    lighthouse: str | None = None  # --lighthouse: one of defaults.LIGHTHOUSES; None: cli/replica_groups.py decides


#: The ``runtime:`` keys: the fields of ``Runtime``, the one definition. Config loading reads
#: exactly these (``config/runtime_reader.py``), and tests hold the reference in this module's docstring to them.
RUNTIME_KEYS: tuple[str, ...] = tuple(f.name for f in fields(Runtime))

#: ``runtime.mps_active_thread_percentage``: CUDA takes 1..100.
MPS_ACTIVE_THREAD_RANGE = (1, 100)


def procs_per_gpu_problem(procs_per_gpu: int, enable_mps: bool, max_clients_per_gpu: int | None) -> str | None:
    """The procs-per-GPU / MPS-client rule, the one copy config loading, ``plan`` and the MPS
    daemon all apply: more than one process per GPU needs MPS, and at most its client limit."""
    if procs_per_gpu > 1 and not enable_mps:
        return (
            f"procs_per_gpu: {procs_per_gpu} needs enable_mps: true (several processes share a GPU well "
            "only under MPS); set runtime.enable_mps: true or runtime.procs_per_gpu: 1"
        )
    if max_clients_per_gpu is not None and procs_per_gpu > max_clients_per_gpu:
        return (
            f"procs_per_gpu: {procs_per_gpu} exceeds mps_max_clients_per_gpu: {max_clients_per_gpu}; lower "
            f"runtime.procs_per_gpu to at most {max_clients_per_gpu} or raise runtime.mps_max_clients_per_gpu"
        )
    return None


def node_rank_counts(nodes: Sequence[NodeSpec], procs_per_gpu: int) -> dict[str, int]:
    """Ranks per node (``cpu_workers``, or GPUs x ``procs_per_gpu``), for ``parallel.size_problems``."""
    return {n.name: n.cpu_workers if n.cpu_workers is not None else len(n.gpus) * procs_per_gpu for n in nodes}


def pinned_limit_problem(value: str) -> str | None:
    """The pinned-memory rule (config loading and the MPS daemon): what
    ``set_default_device_pinned_mem_limit`` accepts, an integer followed by M or G."""
    if PINNED_MEM_LIMIT_RE.fullmatch(value):
        return None
    return f'{value!r} is not a size MPS accepts: expected an integer followed by M or G, e.g. "40G" or "512M"'


def active_thread_percentage_problem(value: int) -> str | None:
    """``mps_active_thread_percentage`` outside what CUDA takes."""
    low, high = MPS_ACTIVE_THREAD_RANGE
    return None if low <= value <= high else f"{value} is out of range; use an integer from {low} to {high}"


#: Preflight tier kinds: the keys of ``preflight.expect_busbw_gbps`` and the tiers' ``kind``.
PREFLIGHT_TIER_KINDS: tuple[str, ...] = ("nvlink", "node")


@dataclass(frozen=True)
class PreflightSettings:
    """``preflight:`` of the config; None = the default (see docs/preflight.md)."""

    expect_busbw_gbps: Mapping[str, float] = field(default_factory=dict)  # tier kind -> GB/s floor
    size_mib: int | None = None
    iters: int | None = None


@dataclass(frozen=True)
class Config:
    nodes: tuple[NodeSpec, ...]
    runtime: Runtime = field(default_factory=Runtime)
    parallel: ParallelSpec = field(default_factory=ParallelSpec)
    preflight: PreflightSettings = field(default_factory=PreflightSettings)
    source: str = "<config>"
    warnings: tuple[str, ...] = ()  # e.g. deprecated NCCL variables, shared IPs

    def node(self, name: str) -> NodeSpec:
        """The node called ``name``; the error lists the valid names."""
        for n in self.nodes:
            if n.name == name:
                return n
        from openclaw_launch.errors import PlanError
        from openclaw_launch.limits import listed

        names = listed([n.name for n in self.nodes])
        raise PlanError(f"node {name!r} is not in {self.source}; the config has: {names}")


#: Deprecated or removed NCCL variables -> what to do instead (from the NCCL
#: environment-variable docs). Only warnings: NCCL ignores or still honours them.
NCCL_DEPRECATED: Mapping[str, str] = {
    "NCCL_MIN_NRINGS": "renamed; use NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NRINGS": "renamed; use NCCL_MAX_NCHANNELS",
    "NCCL_IB_GDR_LEVEL": "renamed; use NCCL_NET_GDR_LEVEL",
    "NCCL_IB_CUDA_SUPPORT": "removed; use NCCL_NET_GDR_LEVEL",
    "NCCL_LL_THRESHOLD": "removed; NCCL ignores it (choose protocols with NCCL_PROTO)",
    "NCCL_TREE_THRESHOLD": "removed; NCCL ignores it (choose algorithms with NCCL_ALGO)",
    "NCCL_SINGLE_RING_THRESHOLD": "removed; NCCL ignores it",
    "NCCL_RINGS": "removed; NCCL ignores it (it searches the topology itself)",
    "NCCL_CHECKS_DISABLE": "deprecated; use NCCL_CHECK_POINTERS",
}

#: Variables whose legacy integer levels are deprecated -> the named levels to use.
NCCL_NAMED_LEVELS: Mapping[str, str] = {
    "NCCL_P2P_LEVEL": "LOC, NVL, PIX, PXB, PHB or SYS",
    "NCCL_NET_GDR_LEVEL": "LOC, PIX, PXB, PHB or SYS",
}
