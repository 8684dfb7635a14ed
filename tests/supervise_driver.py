"""A launcher in a separate process for tests that signal or SIGKILL it.

``python tests/supervise_driver.py [options] -- <fake_worker args>`` runs N fake workers under
``supervise`` and exits with the job's exit code. ``make_plan`` is also the tests' plan builder.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile

from openclaw_launch.plan.context import run_context
from openclaw_launch.plan.model import LaunchPlan, RankPlan
from openclaw_launch.run.supervise import SuperviseOptions, supervise

FAKE_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_worker.py")


def rank_plan(
    rank: int,
    gpu_uuid: str | None = None,
    cpus: tuple[int, ...] = (),
    argv: tuple[str, ...] = ("python3", "train.py"),
    env: dict[str, str] | None = None,
) -> RankPlan:
    """One local rank on node0, as build_plan shapes it; tests fill in only what they look at."""
    return RankPlan(
        rank=rank,
        local_rank=rank,
        node="node0",
        node_rank=0,
        gpu_uuid=gpu_uuid,
        gpu_index=None,
        pci_bus_id=None,
        numa_node=None,
        cpus=cpus,
        mem_policy="none",
        mem_nodes=(),
        argv=argv,
        env=env or {},
    )


def make_plan(
    n: int,
    worker_args: list[str],
    *,
    prefix: tuple[str, ...] = (),
    cpus: tuple[int, ...] = (),
    error_dir: str | None = None,
    run_id: str = "test-run",
) -> LaunchPlan:
    """A plan of n fake workers on one node (what build_plan would produce, minus topology)."""
    ranks = []
    for i in range(n):
        env = {"RANK": str(i), "LOCAL_RANK": str(i), "WORLD_SIZE": str(n), "TORCHELASTIC_RESTART_COUNT": "99"}
        if error_dir is not None:
            env["TORCHELASTIC_ERROR_FILE"] = os.path.join(error_dir, f"error-{i}.json")
        ranks.append(rank_plan(i, cpus=cpus, argv=(*prefix, sys.executable, FAKE_WORKER, *worker_args), env=env))
    return LaunchPlan(
        run_id=run_id,
        node="node0",
        node_rank=0,
        nnodes=1,
        world_size=n,
        master_addr="127.0.0.1",
        master_port=29500,
        backend="gloo",
        ranks=tuple(ranks),
        run_dir=run_context(run_id, tempfile.gettempdir(), os.getpid()).run_dir,
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--grace", type=float, default=5.0)
    p.add_argument("--kill-timeout", type=float, default=5.0)
    p.add_argument("--max-restarts", type=int, default=0)
    p.add_argument("--no-guardian", action="store_true")
    p.add_argument("--result", default=None, help="write the JobResult as JSON here")
    p.add_argument("worker_args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    worker_args = a.worker_args[1:] if a.worker_args[:1] == ["--"] else a.worker_args
    options = SuperviseOptions(
        grace_period_s=a.grace,
        kill_timeout_s=a.kill_timeout,
        max_restarts=a.max_restarts,
        use_guardian=not a.no_guardian,
    )
    result = supervise(make_plan(a.nproc, worker_args), options)
    if a.result:
        with open(a.result, "w") as f:
            json.dump(dataclasses.asdict(result), f)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
