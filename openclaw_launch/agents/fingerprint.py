"""What every node of a job must agree on before any worker starts, and the differences. Pure
(the versions are read by ``agents/versions.py``).

A fingerprint is a flat ``key -> value`` map so a difference names one key with both values:
``config.*`` (the config in canonical form, and ``config.sha256`` of it), ``job.*`` (world size,
nodes, master address and port), ``env.*`` (every NCCL_*/CUDA_*/TORCH_*/OPENCLAW_*/NVSHMEM_*/OMP_*
variable the ranks get: the plan's common environment on top of the launcher's own, which the
workers inherit; per-rank values left out), ``gpu.*`` (the planned GPUs' count, models and
host indexes in local-rank order) and ``version.*`` (torch, the CUDA it was built for, NCCL, the CUDA
runtime, the driver, the launcher, Python).

A difference refuses the start, except on the keys of ``WARN_ONLY`` (docs/multinode.md's table,
rendered by ``tools/option_docs.py``), where every node prints it as a warning and the job runs.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from openclaw_launch.agents.job_secret import SECRET_ENV  # the job's secret: in no fingerprint, never published
from openclaw_launch.config.model import Config
from openclaw_launch.plan.env import NIC_ENV, PER_RANK_ENV, common_env
from openclaw_launch.plan.model import LaunchPlan
from openclaw_launch.run.gpu_memory import NVML_RECORDING_ENV

UNSET = "<unset>"
#: The launcher's own variables that differ by node by design (a standby is one node's role; the tests'
#: recorded NVML is one node's hardware, run/gpu_memory.py), never compared.
_NOT_COMPARED = frozenset({SECRET_ENV, "OPENCLAW_STANDBY", NVML_RECORDING_ENV})
_ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "OPENCLAW_", "NVSHMEM_", "OMP_")
#: Per-rank variables a rank keeps from the launcher when set there: then every rank has the same.
_INHERITED_AS_IS = frozenset({"OMP_NUM_THREADS"})
_JOB_ENV = (
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_MAX_RESTARTS",
)
_CONFIG_SKIP = ("source", "warnings")  # where it was read from (and what reading it said), not what it says
_WHERE_KEYS = ("line", "where")  # at any depth: a node's or GPU's YAML line, where a parallel size was given


def canonical_config(config: Config) -> dict[str, Any]:
    """The config as plain data, without where it came from: two configs that differ only in
    comments or blank lines agree."""
    data = dataclasses.asdict(config)
    return {k: _without_where(v) for k, v in data.items() if k not in _CONFIG_SKIP}


def _without_where(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_where(v) for k, v in value.items() if k not in _WHERE_KEYS}
    if isinstance(value, list | tuple):
        return [_without_where(v) for v in value]
    return value


@dataclass(frozen=True)
class WarnOnly:
    """Fingerprint keys (a ``fnmatch`` pattern) on which nodes may differ, with a warning."""

    pattern: str
    why: str


#: The one list of differences that warn instead of refusing the start (docs/multinode.md).
WARN_ONLY: tuple[WarnOnly, ...] = (
    WarnOnly("env.NCCL_DEBUG", "NCCL's log level: more output, same communication"),
    WarnOnly("env.NCCL_DEBUG_SUBSYS", "which NCCL subsystems log"),
    WarnOnly("env.NCCL_DEBUG_FILE", "where NCCL's log goes"),
    WarnOnly("env.TORCH_SHOW_CPP_STACKTRACES", "longer error messages only"),
    WarnOnly("env.TORCH_CPP_LOG_LEVEL", "c10's log level"),
    WarnOnly("env.TORCH_LOGS", "torch's logging (torch._logging)"),
    WarnOnly("env.NVSHMEM_DEBUG", "NVSHMEM's log level"),
    WarnOnly("env.NVSHMEM_DEBUG_FILE", "where NVSHMEM's log goes"),
    WarnOnly("env.OMP_*", "CPU threads per rank: a node may be slower, results are the same"),
    WarnOnly("gpu.models", "NCCL runs across GPU models; the job steps at the slowest GPU's pace"),
    WarnOnly("gpu.order", "which host GPUs the local ranks use; the UUIDs are the config's, compared as config"),
)


def warns_only(key: str) -> bool:
    """A difference on ``key`` is a warning (``WARN_ONLY``), not a refusal."""
    return any(fnmatch.fnmatchcase(key, rule.pattern) for rule in WARN_ONLY)


def fingerprint(
    config: Config,
    plan: LaunchPlan,
    versions: Mapping[str, str],
    launcher_env: Mapping[str, str],
) -> dict[str, str]:
    """This node's fingerprint. ``launcher_env`` is the launcher's environment: the workers start
    with it under the plan's variables, so a ``CUDA_LAUNCH_BLOCKING=1`` set on one node only is a
    difference even though the plan never names it. With ``runtime.nic_binding: nearest`` each
    rank's NIC variable is its own (``plan.env.NIC_ENV``) and left out."""
    fp: dict[str, str] = {}
    canonical = canonical_config(config)
    _flatten("config", canonical, fp)
    fp["config.sha256"] = hashlib.sha256(json.dumps(canonical, sort_keys=True, default=str).encode()).hexdigest()
    fp["job.world_size"] = str(plan.world_size)
    fp["job.nnodes"] = str(plan.nnodes)
    fp["job.master"] = f"{plan.master_addr}:{plan.master_port}"
    fp["job.run_id"] = plan.run_id
    inherited = launcher_env_keys(launcher_env)
    skipped = set(NIC_ENV.values()) if config.runtime.nic_binding == "nearest" else set()
    for key, value in sorted({**inherited, **common_env(plan)}.items()):
        if (key.startswith(_ENV_PREFIXES) or key in _JOB_ENV) and key not in skipped:
            fp[f"env.{key}"] = value
    fp.update(_gpu_keys(plan))
    for key, value in versions.items():
        fp[f"version.{key}"] = value
    return fp


def launcher_env_keys(launcher_env: Mapping[str, str]) -> dict[str, str]:
    """The launcher's variables that every rank inherits as they are (the ``env.*`` keys before the
    plan's own): never the job's secret (agents/liveness.py), which a fingerprint would publish, nor
    ``OPENCLAW_STANDBY`` (``--standby`` on one node)."""
    skipped = (PER_RANK_ENV - _INHERITED_AS_IS) | _NOT_COMPARED
    return {k: v for k, v in launcher_env.items() if k.startswith(_ENV_PREFIXES) and k not in skipped}


def _gpu_keys(plan: LaunchPlan) -> dict[str, str]:
    """The planned GPUs: how many, their models, and their host indexes in local-rank order."""
    gpus = {r.gpu_index: r.gpu_model or "?" for r in plan.ranks if r.gpu_index is not None}
    return {
        "gpu.count": str(len(gpus)),
        "gpu.models": ", ".join(dict.fromkeys(gpus.values())) or "-",
        "gpu.order": ",".join(map(str, gpus)) or "-",
    }


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, Mapping):
        if not value:
            out[prefix] = "{}"
        for k, v in value.items():
            _flatten(f"{prefix}.{k}", v, out)
    elif isinstance(value, list | tuple):
        if not value:
            out[prefix] = "[]"
        for i, v in enumerate(value):
            _flatten(f"{prefix}[{i}]", v, out)
    else:
        out[prefix] = json.dumps(value, sort_keys=True, default=str)


@dataclass(frozen=True)
class Differences:
    """Every key on which a node differs from the first, one line each, split by what it does."""

    refused: tuple[str, ...]
    warned: tuple[str, ...]


def differences(prints: Mapping[str, Mapping[str, str]]) -> Differences:
    """Compare every node with the first: ``node B: env.NCCL_DEBUG = 'INFO', node A has <unset>``."""
    lines = _difference_lines(prints)
    return Differences(
        refused=tuple(line for key, line in lines if not warns_only(key)),
        warned=tuple(line for key, line in lines if warns_only(key)),
    )


def _difference_lines(prints: Mapping[str, Mapping[str, str]]) -> list[tuple[str, str]]:
    names = list(prints)
    if len(names) < 2:
        return []
    first = names[0]
    ref = prints[first]
    lines: list[tuple[str, str]] = []
    for name in names[1:]:
        mine = prints[name]
        for key in sorted(set(ref) | set(mine)):
            a, b = ref.get(key, UNSET), mine.get(key, UNSET)
            if a != b:
                lines.append((key, f"node {name}: {key} = {_show(b)}, node {first} has {_show(a)}"))
    return lines


def _show(value: str) -> str:
    return value if value == UNSET else repr(value)
