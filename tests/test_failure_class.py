"""The pure failure classifier (run/failure_class.py), the restart-storm rule of the failure policy
driven through its participant methods, the exit codes, and docs/failures.md's generated tables."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from openclaw_launch.exit_codes import EXIT_CODES, REQUEUE, SCRIPT_FAILED
from openclaw_launch.run import cgroup
from openclaw_launch.run.failure_class import (
    BY_NAME,
    CAN_HELP,
    CANNOT_HELP,
    CLASSES,
    MAY_HELP,
    Evidence,
    GpuEvent,
    classify,
)
from openclaw_launch.run.failure_policy import FailurePolicy
from openclaw_launch.run.participant import StopKind, StopReason
from tools.failure_docs import DOCS_FILE, TABLES, update
from tools.markdown_tables import marked_tables

GPU = "GPU-1"


def record(message: str) -> str:
    """An error file as torch's ``@record`` writes it."""
    return json.dumps({"message": {"message": message, "extraInfo": {"py_callstack": "tb", "timestamp": "1"}}})


@pytest.mark.parametrize(
    ("evidence", "name", "detail"),
    [
        (Evidence(exit_code=1, error_file=record("ValueError: bad")), "exception", "ValueError"),
        (Evidence(exit_code=1, error_file="KeyError: 'lr'"), "exception", "KeyError"),  # not JSON: the raw text
        (
            Evidence(
                exit_code=1, stderr_tail=("Traceback (most recent call last):", '  File "t.py"', "a.b.MyError: x")
            ),
            "exception",
            "a.b.MyError",
        ),
        (Evidence(exit_code=1, error_file=record("torch.OutOfMemoryError: CUDA out of memory.")), "cuda-oom", None),
        (
            Evidence(exit_code=1, stderr_tail=("RuntimeError: CUDA out of memory. Tried to allocate 2 GiB",)),
            "cuda-oom",
            None,
        ),
        (
            Evidence(
                exit_code=1, error_file=record("torch.distributed.DistBackendError: NCCL error in: x, ncclSystemError")
            ),
            "nccl",
            "torch.distributed.DistBackendError: NCCL error",
        ),
        (
            Evidence(
                signal=signal.SIGABRT, stderr_tail=("[Rank 1] Watchdog caught collective operation timeout: ...",)
            ),
            "nccl",
            "Watchdog caught collective operation timeout",
        ),
        (
            Evidence(exit_code=1, error_file=record("torch.distributed.DistNetworkError: Connection reset by peer")),
            "fabric",
            "torch.distributed.DistNetworkError",
        ),
        (  # classes by backend: gloo's own error is gloo's, not NCCL's
            Evidence(
                exit_code=1,
                error_file=record(
                    "torch.distributed.DistBackendError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
                    "Connection closed by peer [127.0.0.1]:4242"
                ),
            ),
            "gloo",
            "torch.distributed.DistBackendError: gloo/transport",
        ),
        (  # a port in use, on any backend, is neither NCCL's nor a cause a restart is known to cure
            Evidence(
                exit_code=1,
                stderr_tail=(
                    "Traceback (most recent call last):",
                    '  File "train.py", line 3, in <module>',
                    "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
                    "network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address "
                    "already in use",
                ),
            ),
            "port-in-use",
            "torch.distributed.DistNetworkError: EADDRINUSE",
        ),
        (  # issue 32 item 7: the log's earlier words are history; the ValueError it died of decides
            Evidence(
                exit_code=1,
                stderr_tail=(
                    "step 40: all_reduce retried once after an NCCL error (ncclRemoteError), recovered",
                    "Traceback (most recent call last):",
                    '  File "train.py", line 9, in <module>',
                    "ValueError: bad batch shape",
                ),
            ),
            "exception",
            "ValueError",
        ),
        (  # the same words in the last lines of an exit without a traceback: still only an earlier line's
            Evidence(exit_code=1, stderr_tail=("retried once after an NCCL error", *(f"step {i}" for i in range(9)))),
            "exit",
            "exit code 1",
        ),
        (  # issue 32 item 7: SIGKILLed from outside after a recovered CUDA OOM: the signal decides
            Evidence(
                signal=signal.SIGKILL,
                stderr_tail=("caught: CUDA out of memory. Tried to allocate 2.00 GiB; halving the batch", "step 7"),
            ),
            "killed",
            "SIGKILL",
        ),
        (  # an earlier traceback the script caught and logged is not the one it died of
            Evidence(
                exit_code=1,
                stderr_tail=(
                    "Traceback (most recent call last):",
                    '  File "train.py", line 3, in <module>',
                    "torch.OutOfMemoryError: CUDA out of memory.",
                    "retrying with a smaller batch",
                    "Traceback (most recent call last):",
                    '  File "train.py", line 7, in <module>',
                    "KeyError: 'lr'",
                ),
            ),
            "exception",
            "KeyError",
        ),
        (Evidence(exit_code=1, error_file=record("RuntimeError: CUDA out of memory. Tried 2 GiB")), "cuda-oom", None),
        (  # torch.distributed's excepthook prefixes each line of a rank's traceback
            Evidence(
                exit_code=1,
                stderr_tail=(
                    "[rank0]: Traceback (most recent call last):",
                    '[rank0]:   File "w.py", line 34, in <module>',
                    "[rank0]:     dist.all_reduce(x)",
                    "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
                    "by peer [127.0.0.1]:18592. This is typically caused by a remote worker crashing.",
                ),
            ),
            "gloo",
            "RuntimeError: gloo/transport",
        ),
        (Evidence(exit_code=1, error_file=record("ValueError: NCCL error is not mine")), "exception", "ValueError"),
        (Evidence(signal=signal.SIGKILL, oom_kills=1), "host-oom", None),
        (Evidence(signal=signal.SIGKILL), "killed", "SIGKILL"),
        (Evidence(signal=signal.SIGSEGV), "crash", "SIGSEGV"),
        (Evidence(exit_code=127, not_started=True), "not-started", "exit code 127"),
        (Evidence(exit_code=3), "exit", "exit code 3"),
        (Evidence(exit_code=3, gpu_events=(GpuEvent("xid", GPU, 79),)), "gpu-xid", "NVML: XID 79 on GPU-1"),
        (Evidence(exit_code=3, gpu_events=(GpuEvent("ecc", GPU),)), "gpu-ecc", "NVML: ECC on GPU-1"),
        (Evidence(stop="hang"), "hang", None),
        (Evidence(stop="lost"), "node-lost", None),
        (Evidence(stop="remote"), "remote", None),
    ],
)
def test_each_failure_is_classified_by_its_strongest_evidence(
    evidence: Evidence, name: str, detail: str | None
) -> None:
    failure = classify(evidence, rank=1, node="a")
    assert failure.name == name and (failure.rank, failure.node) == (1, "a")
    if detail is not None:
        assert failure.detail == detail


def test_the_gpu_outranks_what_the_script_said_and_a_kill_needs_the_oom_count() -> None:
    xid = Evidence(exit_code=1, error_file=record("RuntimeError: CUDA error: unspecified launch failure"))
    assert classify(xid).name == "exception"
    assert classify(Evidence(**{**xid.__dict__, "gpu_events": (GpuEvent("xid", GPU, 13),)})).name == "gpu-xid"
    assert classify(Evidence(signal=signal.SIGTERM, oom_kills=2)).name == "killed"  # the OOM killer sends SIGKILL


def test_the_table_says_which_classes_a_restart_can_help() -> None:
    helps = {c.name for c in CLASSES if c.restart_helps}
    assert helps == {"gpu-xid", "gpu-ecc", "node-lost", "hang", "nccl", "gloo", "fabric", "killed", "reform", "exclude"}
    assert {c.name for c in CLASSES if c.restart == CANNOT_HELP} == {"cuda-oom", "host-oom", "not-started"}
    assert all(c.restart in (CAN_HELP, MAY_HELP, CANNOT_HELP) for c in CLASSES)
    assert len(BY_NAME) == len(CLASSES)


def _policy(steps: dict[int, int], max_restarts: int = 5) -> tuple[FailurePolicy, list[str]]:
    said: list[str] = []
    policy = FailurePolicy(
        {0: GPU, 1: None}, max_restarts, said.append, steps_of=lambda r: steps.get(r, 0), storm_guard=True
    )
    return policy, said


def _fail(policy: FailurePolicy, attempt: int, rank: int, message: str) -> StopReason | None:
    policy.begin_attempt(attempt)
    evidence = Evidence(exit_code=1, error_file=record(message))
    policy.on_stop(StopReason(StopKind.FAILURE, 1, "root cause", True, "a", rank, evidence))
    return policy.stop_reason()


def test_the_storm_needs_the_same_class_on_the_same_rank_before_any_step_in_a_row() -> None:
    policy, said = _policy({})
    assert _fail(policy, 0, 0, "ValueError: x") is None
    assert _fail(policy, 1, 1, "ValueError: x") is None  # another rank
    assert _fail(policy, 2, 1, "torch.distributed.DistNetworkError: x") is None  # another class
    storm = _fail(policy, 3, 1, "torch.distributed.DistNetworkError: x")
    assert storm is not None and storm.kind is StopKind.STORM and not storm.restartable and storm.rank == 1
    assert policy.failures[3].storm and not policy.failures[2].storm
    assert len(said) == 1 and "rank 1" in said[0] and "fabric" in said[0]


def test_no_storm_after_steps_on_the_last_attempt_or_without_statistics() -> None:
    policy, _ = _policy({0: 3})
    assert _fail(policy, 0, 0, "ValueError: x") is None and _fail(policy, 1, 0, "ValueError: x") is None
    last, _ = _policy({}, max_restarts=1)
    assert _fail(last, 0, 0, "ValueError: x") is None and _fail(last, 1, 0, "ValueError: x") is None
    blind = FailurePolicy({}, 5, lambda text: None, storm_guard=True)  # --telemetry off: steps unknown
    assert _fail(blind, 0, 0, "ValueError: x") is None and _fail(blind, 1, 0, "ValueError: x") is None


def test_the_policy_counts_only_this_attempts_oom_kills_and_gpu_events() -> None:
    counts, events = [4], [GpuEvent("xid", GPU, 31)]
    policy = FailurePolicy({0: GPU}, 0, lambda text: None, oom_kills=lambda: counts[0], gpu_events=lambda: events)
    policy.begin_attempt(0)
    counts[0] = 5
    policy.on_stop(StopReason(StopKind.FAILURE, 137, "", True, "a", 0, Evidence(signal=signal.SIGKILL)))
    assert policy.failures[0].name == "host-oom"  # the XID came before the attempt
    policy.begin_attempt(1)
    events.append(GpuEvent("xid", "GPU-other", 79))  # another rank's GPU
    policy.on_stop(StopReason(StopKind.SIGNAL, 143, "", False, "a"))  # a signal is no failure
    assert 1 not in policy.failures
    policy.on_stop(StopReason(StopKind.FAILURE, 1, "", True, "a", 0, Evidence(exit_code=1)))
    assert policy.failures[1].name == "exit"


def test_exit_code_classes_map_a_failed_job_to_70_or_75_and_keep_the_rest() -> None:
    policy = FailurePolicy({}, 0, lambda text: None)
    policy.begin_attempt(0)
    policy.on_stop(StopReason(StopKind.LOST, 1, "node b lost", False, "b"))
    assert policy.exit_code(1, 1, None) == REQUEUE
    assert policy.exit_code(143, 1, signal.SIGTERM) == 143 and policy.exit_code(0, 1, None) == 0
    policy.failures[0] = classify(Evidence(exit_code=2, error_file=record("ValueError: x")))
    assert policy.exit_code(2, 1, None) == SCRIPT_FAILED
    assert policy.exit_code(2, 2, None) == 2  # no classified failure for the last attempt: unchanged


def test_oom_kills_reads_memory_events(tmp_path: Path) -> None:
    assert cgroup.oom_kills(str(tmp_path)) is None
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 2\noom 1\noom_kill 3\noom_group_kill 0\n")
    assert cgroup.oom_kills(str(tmp_path)) == 3


def test_docs_failures_md_tables_are_the_tables() -> None:
    text = DOCS_FILE.read_text()
    assert update(text) == text, "regenerate: python -m tools.failure_docs --write"
    assert set(marked_tables(text)) == set(TABLES)
    codes = [c.code for c in EXIT_CODES]
    assert str(SCRIPT_FAILED) in codes and str(REQUEUE) in codes and len(set(codes)) == len(codes)


def test_a_node_arriving_at_an_elastic_job_is_its_own_class_not_a_remote_failure() -> None:
    failure = classify(Evidence(stop="reform"), None, "n1")
    assert failure.name == "reform" and BY_NAME["reform"].restart_helps
