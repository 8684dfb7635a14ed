"""This node's fingerprint as ``validate`` shows it: the one the agents compare before a multi-node
start (``agents/fingerprint.py``), built from the plan ``run`` would make here (the run id and the
script are placeholders: neither is known to ``validate``)."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

from openclaw_launch.agents.fingerprint import fingerprint
from openclaw_launch.agents.versions import node_versions, python_version_of
from openclaw_launch.config.model import Config
from openclaw_launch.errors import OpenclawError
from openclaw_launch.plan.build import build_plan
from openclaw_launch.plan.context import RUN_ID_PLACEHOLDER, run_context
from openclaw_launch.plan.model import Entry, PlanOptions
from openclaw_launch.topology.model import Topology


def node_fingerprint(
    config: Config, node: str, topology: Topology, environ: Mapping[str, str], host_root: Path, python: str
) -> dict[str, str] | str:
    """The fingerprint, or why there is none (the plan cannot be built: the checks say why)."""
    options = PlanOptions(entry=Entry("script", "<script>"), node=node, python=python, base_env=dict(environ))
    try:
        plan = build_plan(config, topology, run_context(RUN_ID_PLACEHOLDER, tempfile.gettempdir(), None), options)
    except OpenclawError as e:
        return f"no plan for node {node}: {e}"
    return fingerprint(config, plan, node_versions(host_root, lambda: python_version_of(python)), environ)


def format_fingerprint(fp: dict[str, str] | str) -> str:
    """One ``key = value`` line per key, the flattened ``config.*`` keys as their hash."""
    if isinstance(fp, str):
        return f"fingerprint: {fp}"
    shown = {k: v for k, v in fp.items() if not k.startswith("config.") or k == "config.sha256"}
    lines = ["fingerprint (what the agents of a multi-node run compare; docs/multinode.md):"]
    lines += [f"  {key} = {value}" for key, value in shown.items()]
    return "\n".join(lines)
