"""The preflight worker's timed loops: a GEMM per GPU (per CPU rank) and an all-reduce per node
pair. Worker side only: ``torch`` and ``dist`` are passed in by ``worker.py``, which imports them.

``OPENCLAW_PREFLIGHT_TEST_SLOWDOWN=F`` (tests only, docs/preflight.md): this rank really takes F
times as long in both loops (it sleeps (F - 1) x the measured time inside each timed window, and an
all-reduce partner waits for it), so a slowed loopback node is seen as a slow node would be.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from typing import Any

SLOWDOWN_VAR = "OPENCLAW_PREFLIGHT_TEST_SLOWDOWN"


def slowdown(env: Mapping[str, str]) -> float:
    """The test hook's factor (1.0 without it; a value that is no number >= 1 is an error here, in
    the worker: the variable is for tests)."""
    value = env.get(SLOWDOWN_VAR)
    factor = float(value) if value else 1.0
    if not factor >= 1.0:
        raise ValueError(f"{SLOWDOWN_VAR}={value!r}: expected a factor >= 1")
    return factor


def _sync(device: Any, torch: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _stretch(start: float, factor: float) -> float:
    """The seconds since ``start``, stretched to ``factor`` times them by sleeping (the test hook)."""
    elapsed = time.perf_counter() - start
    if factor > 1.0:
        time.sleep((factor - 1.0) * elapsed)
    return time.perf_counter() - start


def time_gemm(torch: Any, device: Any, n: int, reps: int, matmuls: int, factor: float) -> dict[str, Any]:
    """The best of ``reps`` repetitions of ``matmuls`` n x n matrix products (bf16 on a GPU, float32 on
    the rank's own CPUs, whose thread count is the plan's OMP_NUM_THREADS), as TFLOPS: the best, as
    a preempted or throttled repetition only makes a GPU look slower than it is."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(3):  # warm-up: library initialisation, clocks up
        torch.mm(a, b, out=out)
    _sync(device, torch)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(matmuls):
            torch.mm(a, b, out=out)
        _sync(device, torch)
        best = min(best, _stretch(start, factor))
    return {"tflops": 2 * n**3 * matmuls / best / 1e12, "dtype": str(dtype).removeprefix("torch."), "n": n}


def time_pair(
    dist: Any, torch: Any, group: Any, device: Any, size_bytes: int, iters: int, warmup: int, factor: float
) -> tuple[float, bool]:
    """The median seconds of ``iters`` all-reduces of ``size_bytes`` float32 in ``group`` (each timed
    alone: one preempted all-reduce does not move the median), and whether a sum of ones came back
    as the group size."""
    x = torch.ones(max(1, size_bytes // 4), dtype=torch.float32, device=device)
    dist.all_reduce(x, group=group)
    correct = bool((x == float(dist.get_world_size(group))).all().item())
    for _ in range(warmup):
        dist.all_reduce(x, group=group)
    _sync(device, torch)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        dist.all_reduce(x, group=group)
        _sync(device, torch)
        times.append(_stretch(start, factor))
    return statistics.median(times), correct
