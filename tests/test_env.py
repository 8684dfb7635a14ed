"""The per-rank environment: torchrun's set, CUDA by UUID, NCCL, OPENCLAW_*."""

from __future__ import annotations

import re

from openclaw_launch.config.model import Config, NodeSpec, Runtime
from openclaw_launch.plan.build import build_plan
from openclaw_launch.plan.context import run_context
from openclaw_launch.plan.env import JobEnv, RankSlot, common_user_env, overridden_user_vars, rank_env, visible_devices
from openclaw_launch.plan.model import Entry, PlanOptions
from openclaw_launch.telemetry import wire
from openclaw_launch.topology.model import Topology

RUN_DIR = run_context("r1", "/tmp", 42, log_dir="/logs").run_dir

TORCHRUN_VARS = set(  # the spec, written out independently of env.TORCHRUN_ENV
    "RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK ROLE_NAME ROLE_WORLD_SIZE "
    "MASTER_ADDR MASTER_PORT TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS TORCHELASTIC_RUN_ID "
    "TORCHELASTIC_USE_AGENT_STORE TORCHELASTIC_ERROR_FILE TORCH_NCCL_ASYNC_ERROR_HANDLING OMP_NUM_THREADS".split()
)


def job(runtime: Runtime | None = None, base_env: dict[str, str] | None = None, **kw: object) -> JobEnv:
    fields: dict[str, object] = dict(
        run_id="r1",
        world_size=8,
        nnodes=2,
        master_addr="10.0.0.1",
        master_port=29400,
        runtime=runtime or Runtime(),
        run_dir=RUN_DIR,
        role="default",
        signals_to_handle="SIGINT,SIGTERM",
        base_env=base_env or {},
    )
    fields.update(kw)
    return JobEnv(**fields)  # type: ignore[arg-type]


def gpu_slot(**kw: object) -> RankSlot:
    fields: dict[str, object] = dict(
        rank=5,
        local_rank=1,
        local_world_size=4,
        node="b",
        node_rank=1,
        cpus=(8, 9, 10, 11, 72, 73, 74, 75),
        cores=4,
        gpu_uuid="GPU-b",
        pci_bus_id="0000:0b:00.0",
        numa_node=0,
        cuda_visible_devices="GPU-a,GPU-b",
        cuda_device_index=1,
    )
    fields.update(kw)
    return RankSlot(**fields)  # type: ignore[arg-type]


def test_torchrun_variables_exactly() -> None:
    env = rank_env(job(max_restarts=3), gpu_slot())
    assert set(env) >= TORCHRUN_VARS
    assert env["RANK"] == "5" and env["ROLE_RANK"] == "5" and env["LOCAL_RANK"] == "1"
    assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "8" and env["LOCAL_WORLD_SIZE"] == "4"
    assert env["GROUP_RANK"] == "1" and env["GROUP_WORLD_SIZE"] == "2" and env["ROLE_NAME"] == "default"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29400")
    assert env["TORCHELASTIC_RESTART_COUNT"] == "0" and env["TORCHELASTIC_MAX_RESTARTS"] == "3"  # attempt 0's
    assert env["TORCHELASTIC_RUN_ID"] == "r1" and env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    assert env["TORCHELASTIC_ERROR_FILE"] == "/logs/r1/errors/attempt-0/rank-5/error.json"
    assert env["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGINT,SIGTERM"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["OMP_NUM_THREADS"] == "4"
    assert rank_env(job(master_port=None), gpu_slot())["MASTER_PORT"] == "<free-port>"  # found when run starts


def test_cuda_and_openclaw_identity() -> None:
    env = rank_env(job(), gpu_slot())
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert env["OPENCLAW_GPU_UUID"] == "GPU-b" and env["OPENCLAW_PCI_BUS_ID"] == "0000:0b:00.0"
    assert env["OPENCLAW_NUMA_NODE"] == "0" and env["OPENCLAW_CPUS"] == "8-11,72-75"
    assert env["OPENCLAW_NODE"] == "b" and env["OPENCLAW_NODE_RANK"] == "1" and env["OPENCLAW_RUN_ID"] == "r1"
    assert env["OPENCLAW_BACKEND"] == "nccl" and env["OPENCLAW_CUDA_DEVICE_INDEX"] == "1"


def test_cpu_worker_keeps_the_launchers_cuda_visible_devices_and_uses_gloo() -> None:
    """Not set for a CPU worker: it inherits the launcher's (a user's value), as under torchrun."""
    env = rank_env(job(), gpu_slot(gpu_uuid=None, pci_bus_id=None, numa_node=None, cuda_device_index=None))
    assert "CUDA_VISIBLE_DEVICES" not in env and env["OPENCLAW_BACKEND"] == "gloo"
    assert env["OPENCLAW_GPU_UUID"] == "" and env["OPENCLAW_NUMA_NODE"] == ""
    assert "OPENCLAW_CUDA_DEVICE_INDEX" not in env


def test_visible_devices_modes() -> None:
    assert visible_devices("ordered", ["GPU-a", "GPU-b", "GPU-c"], "GPU-b") == ("GPU-a,GPU-b,GPU-c", 1)
    assert visible_devices("isolated", ["GPU-a", "GPU-b", "GPU-c"], "GPU-b") == ("GPU-b", 0)


def test_omp_num_threads_respects_the_user() -> None:
    assert "OMP_NUM_THREADS" not in rank_env(job(base_env={"OMP_NUM_THREADS": "3"}), gpu_slot())
    rt = Runtime(env={"OMP_NUM_THREADS": "2"})
    assert rank_env(job(rt), gpu_slot())["OMP_NUM_THREADS"] == "2"
    assert rank_env(job(), gpu_slot(cores=0))["OMP_NUM_THREADS"] == "1"


def test_nccl_settings_and_user_env_passed_literally() -> None:
    nasty = "$(touch /tmp/pwned); echo 'q' \"d\"\nsecond line `id`"
    rt = Runtime(
        nccl_socket_nthreads=8,
        nccl_nthreads=4,
        nccl_env={"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_DEBUG": nasty},
        env={"MY_VAR": nasty, "RANK": "99"},
    )
    env = rank_env(job(rt, base_env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "NCCL_P2P_LEVEL": "NVL"}), gpu_slot())
    assert env["NCCL_SOCKET_NTHREADS"] == "8" and env["NCCL_NTHREADS"] == "4"
    assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1" and env["NCCL_DEBUG"] == nasty and env["MY_VAR"] == nasty
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"  # the inherited value, shown in the plan
    assert env["NCCL_P2P_LEVEL"] == "NVL"  # inherited NCCL_* made visible for node comparison
    assert env["RANK"] == "5"  # the launcher owns RANK
    assert overridden_user_vars(rt) == ("RANK",)


def test_common_user_env_is_rank_independent() -> None:
    rt = Runtime(nccl_nthreads=2, env={"A": "1"})
    base = {"PATH": "/bin", "NCCL_ALGO": "Ring"}
    common = common_user_env(rt, base)
    assert common == {"NCCL_ALGO": "Ring", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_NTHREADS": "2", "A": "1"}
    a = rank_env(job(rt, base), gpu_slot())
    b = rank_env(job(rt, base), gpu_slot(rank=0, local_rank=0, node="a", node_rank=0, gpu_uuid="GPU-a"))
    assert all(a[k] == b[k] == v for k, v in common.items())


def test_the_runs_channels_are_in_the_plan() -> None:
    """Error file, telemetry socket, hang detection, MPS client and groups file: every variable the
    run gives a rank, from the run directory's paths (nothing is added when it starts)."""
    plain = rank_env(job(), gpu_slot())
    run_vars = {wire.SOCKET_ENV, wire.HOOKS_ENV, wire.PROGRESS_ENV, wire.STACKS_ENV, "CUDA_MPS_PIPE_DIRECTORY"}
    assert not run_vars & set(plain) and "TORCH_FR_BUFFER_SIZE" not in plain
    env = rank_env(
        job(telemetry_socket=str(RUN_DIR.socket), telemetry_mode="full", hang_detection=True, mps=True), gpu_slot()
    )
    assert env[wire.SOCKET_ENV] == RUN_DIR.socket and wire.HOOKS_ENV not in env  # abstract: no path limit
    # the name's nonce and the token: random per launcher (16 and 32 hex digits)
    assert re.fullmatch(r"@openclaw-r1-42-[0-9a-f]{16}", env[wire.SOCKET_ENV]), env[wire.SOCKET_ENV]
    assert re.fullmatch(r"[0-9a-f]{32}", env[wire.TOKEN_ENV]) and env[wire.TOKEN_ENV] == RUN_DIR.token
    assert run_context("r1", "/tmp", 42).run_dir.token != RUN_DIR.token
    assert env["TORCH_FR_BUFFER_SIZE"] == "1000" and env["TORCH_NCCL_ENABLE_TIMING"] == "1"
    assert env[wire.PROGRESS_ENV] == str(wire.PROGRESS_INTERVAL_S)
    assert env[wire.STACKS_ENV] == "/tmp/openclaw-r1-42/stacks-rank-5.txt"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/openclaw-r1-42/mps/pipe"
    assert env["CUDA_MPS_LOG_DIRECTORY"] == "/tmp/openclaw-r1-42/mps/log"
    api = rank_env(job(telemetry_socket="/s", telemetry_mode="api"), gpu_slot())
    assert api[wire.HOOKS_ENV] == "0" and "TORCH_FR_BUFFER_SIZE" not in api


def test_every_rank_flushes_its_steps_as_often_as_the_stats_interval_needs() -> None:
    """--stats-interval-s reaches every rank as its recorder's flush interval (the rule's own cases:
    test_telemetry_worker.py); the default cadence keeps 0.5 s; no telemetry, no variable."""
    cfg = Config(nodes=(NodeSpec(name="cpu", cpu_workers=2),), runtime=Runtime(), source="test.yaml")
    topo = Topology(numa_nodes={0: (0, 1)}, allowed_cpus=(0, 1), source="test:tiny")
    context = run_context("r", "/tmp", None)

    def flushes(**opts: object) -> list[str | None]:
        options = PlanOptions(entry=Entry("script", "train.py"), **opts)  # type: ignore[arg-type]
        return [r.env.get(wire.FLUSH_ENV) for r in build_plan(cfg, topo, context, options).ranks]

    assert flushes(telemetry_mode="hooks") == ["0.5", "0.5"]
    assert flushes(telemetry_mode="hooks", stats_interval_s=0.5) == ["0.125", "0.125"]
    assert flushes(telemetry_mode="api", stats_interval_s=1.0) == ["0.25", "0.25"]
    assert flushes(telemetry_mode="off", stats_interval_s=0.5) == [None, None]
