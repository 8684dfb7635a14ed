"""A member's admission to an elastic job, before it can touch the running world.

An elastic world's full fingerprint (agents/fingerprint.py) depends on the world's plan, which a
launcher builds only once it is in a world; a node that differs would be found only at the new
world's meeting, after every running node had stopped for it. So the rendezvous first compares what
a launcher has before any plan: the variables the workers inherit from it (``env.*``, as the full
fingerprint takes them) and its versions (``version.*``: torch, NCCL, CUDA, the driver, the
launcher, and Python when the workers run the launcher's). A refused difference keeps the member
out (it exits 2 naming each key); the running world never hears of it.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping

from openclaw_launch.agents.fingerprint import differences, launcher_env_keys


def admission_print(environ: Mapping[str, str]) -> dict[str, str]:
    """This launcher's side of the admission (read in the agent's helper: files and metadata only,
    never a subprocess, never torch)."""
    from openclaw_launch.agents.versions import node_versions
    from openclaw_launch.plan.env import worker_python
    from openclaw_launch.topology.live import HOST_ROOT

    own_python = worker_python(environ) == sys.executable
    versions = node_versions(HOST_ROOT, platform.python_version)
    if not own_python:  # another interpreter's version is asked at the world's meeting
        versions.pop("python", None)
    prints = {f"env.{k}": v for k, v in launcher_env_keys(environ).items()}
    prints.update({f"version.{k}": v for k, v in versions.items()})
    return prints


def refusal(host: Mapping[str, str], member: Mapping[str, str], who: str) -> str | None:
    """Why the member ``who`` may not join (None: it may): each refused difference, one per line.
    ``version.*`` keys count where both sides have them (Python: where both run their own)."""
    shared = {k for k in set(host) | set(member) if k.startswith("env.") or (k in host and k in member)}
    diff = differences(
        {
            "the first node": {k: host[k] for k in shared if k in host},
            who: {k: member[k] for k in shared if k in member},
        }
    )
    if not diff.refused:
        return None
    return (
        f"{who} does not agree with the running job; refused before the job's world heard of it "
        f"(the running job is untouched), started nothing:\n  " + "\n  ".join(diff.refused)
    )


def own_admission() -> dict[str, str]:
    return admission_print(os.environ)
