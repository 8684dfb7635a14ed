"""What every node of a job must agree on before any worker starts, and the differences. Pure
except ``runtime_versions`` and ``library_versions`` (which read versions; multi-node path only).

A fingerprint is a flat ``key -> value`` map so a difference names one key with both values:
``config.*`` (the config in canonical form), ``job.*`` (world size, nodes, master address and
port), ``env.*`` (every NCCL_*/CUDA_*/TORCH_*/OPENCLAW_*/NVSHMEM_* variable the ranks get: the
plan's common environment on top of the launcher's own, which the workers inherit; per-rank
values left out) and ``version.*`` (torch, NCCL, CUDA driver, launcher, Python).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from openclaw_launch.config.model import Config
from openclaw_launch.plan.env import PER_RANK_ENV, common_env
from openclaw_launch.plan.model import LaunchPlan

UNSET = "<unset>"
_ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "OPENCLAW_", "NVSHMEM_")
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


def fingerprint(
    config: Config, plan: LaunchPlan, versions: Mapping[str, str], launcher_env: Mapping[str, str]
) -> dict[str, str]:
    """This node's fingerprint. ``launcher_env`` is the launcher's environment: the workers start
    with it under the plan's variables, so a ``CUDA_LAUNCH_BLOCKING=1`` set on one node only is a
    difference even though the plan never names it."""
    fp: dict[str, str] = {}
    _flatten("config", canonical_config(config), fp)
    fp["job.world_size"] = str(plan.world_size)
    fp["job.nnodes"] = str(plan.nnodes)
    fp["job.master"] = f"{plan.master_addr}:{plan.master_port}"
    fp["job.run_id"] = plan.run_id
    inherited = {k: v for k, v in launcher_env.items() if k.startswith(_ENV_PREFIXES) and k not in PER_RANK_ENV}
    for key, value in sorted({**inherited, **common_env(plan)}.items()):
        if key.startswith(_ENV_PREFIXES) or key in _JOB_ENV:
            fp[f"env.{key}"] = value
    for key, value in versions.items():
        fp[f"version.{key}"] = value
    return fp


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


def differences(prints: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Every key on which a node differs from the first node, as one line each:
    ``node B: env.NCCL_DEBUG = 'INFO', node A has <unset>``. Empty when all agree."""
    names = list(prints)
    if len(names) < 2:
        return []
    first = names[0]
    ref = prints[first]
    lines: list[str] = []
    for name in names[1:]:
        mine = prints[name]
        for key in sorted(set(ref) | set(mine)):
            a, b = ref.get(key, UNSET), mine.get(key, UNSET)
            if a != b:
                lines.append(f"node {name}: {key} = {_show(b)}, node {first} has {_show(a)}")
    return lines


def _show(value: str) -> str:
    return value if value == UNSET else repr(value)


def runtime_versions(python: str) -> dict[str, str]:
    """torch's and the launcher's package versions and the workers' Python, read in the launcher
    without importing torch (``library_versions`` are read where torch is loaded)."""
    import platform
    import subprocess
    import sys
    from importlib import metadata

    versions: dict[str, str] = {}
    for package, key in (("torch", "torch"), ("openclaw-launch", "launcher")):
        try:
            versions[key] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[key] = UNSET
    if python == sys.executable:
        versions["python"] = platform.python_version()
    else:
        try:
            out = subprocess.run(
                [python, "-c", "import platform; print(platform.python_version())"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            versions["python"] = out.stdout.strip() or f"error: {out.stderr.strip()[-200:]}"
        except (OSError, subprocess.SubprocessError) as e:
            versions["python"] = f"error: {e}"
    return versions


def library_versions(with_gpus: bool) -> dict[str, str]:
    """torch's CUDA and NCCL and the CUDA driver, as ``version.*`` fingerprint keys. Importing torch
    (and NVML) starts threads, so this runs in the agents' store loop helper (agents/store_loop.py),
    which imports torch for the store anyway; never in the launcher, which forks."""
    versions: dict[str, str] = {}
    try:
        import torch

        versions["torch_cuda"] = str(torch.version.cuda)
        versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))  # no CUDA context needed
    except Exception:  # a CPU-only torch has no NCCL
        versions["nccl"] = UNSET
    versions["cuda_driver"] = _cuda_driver() if with_gpus else UNSET
    return {f"version.{key}": value for key, value in versions.items()}


def _cuda_driver() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return str(pynvml.nvmlSystemGetCudaDriverVersion())
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # no NVML: recorded, and compared like any value
        return f"unknown ({type(e).__name__})"
