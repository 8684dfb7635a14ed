"""The findings beyond one slow rank (issue 27 items 5 and 9): per-step imbalance from aligned steps
(stats/imbalance.py) and GPU memory asymmetry between ranks of one role (stats/memory.py), in the
report, its saved form and the exit summary. The GPU memory is replayed from NVML samples recorded on
the 2x H200 host (tests/data/nvml-samples-h200x2.json): NVML is the absent hardware."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

from report_samples import node_report

from openclaw_launch.codec import to_json
from openclaw_launch.plan.model import RankPlan
from openclaw_launch.plan.parallel import ParallelLayout
from openclaw_launch.report.build import load_report, write_report
from openclaw_launch.report.format import format_report
from openclaw_launch.stats.gpu import GpuSummary
from openclaw_launch.stats.imbalance import MIN_STEPS, StepAlignment, moving_stragglers
from openclaw_launch.stats.imbalance import live_text as imbalance_live
from openclaw_launch.stats.memory import find_asymmetry
from openclaw_launch.stats.memory import live_text as memory_live
from openclaw_launch.stats.result import MEMORY_ASYMMETRY_SHARE, GpuStats, StepImbalance
from openclaw_launch.stats.verdict import Z_SIGNIFICANT, slowdown_floor_s
from openclaw_launch.telemetry import wire

DATA = Path(__file__).parent / "data"
SAMPLES = DATA / "nvml-samples-h200x2.json"


def _rank(rank: int, gpu: str | None, node: str = "n0") -> RankPlan:
    return RankPlan(rank, rank, node, 0, gpu, rank, None, 0, (rank,), "none", (), ("python",), {})


def _recorded(extra_mib: dict[str, float] | None = None) -> dict[str, GpuStats]:
    """Each recorded GPU's summary, as the sampler makes it; ``extra_mib`` adds memory to a GPU's samples."""
    data = json.loads(SAMPLES.read_text())
    out = {}
    for uuid, samples in data["samples"].items():
        summary = GpuSummary()
        for sample in samples:
            add = (extra_mib or {}).get(uuid, 0.0)
            summary.add({**sample, "memory_used_mib": sample["memory_used_mib"] + add})
        out[uuid] = summary.stats()
    return out


UUIDS = sorted(json.loads(SAMPLES.read_text())["samples"])


def test_the_recorded_pair_holds_the_same_memory_and_is_no_finding() -> None:
    ranks = [_rank(0, UUIDS[0]), _rank(1, UUIDS[1])]
    gpus = _recorded()
    assert gpus[UUIDS[0]].memory_used_mib_max == gpus[UUIDS[1]].memory_used_mib_max  # 22.3 GiB each
    assert find_asymmetry(ranks, None, gpus) == ()


def test_a_rank_holding_more_than_its_peer_is_named_once() -> None:
    ranks = [_rank(0, UUIDS[0]), _rank(1, UUIDS[1])]
    [found] = find_asymmetry(ranks, None, _recorded({UUIDS[1]: 4096.0}))  # 4 GiB more state on rank 1
    assert (found.rank, found.role, found.excess_gib) == (1, "all", 4.0)
    assert found.text.startswith("memory: rank 1 on node n0 holds 4.0 GiB more than its peers")
    assert "partitioning/sharding is uneven" in found.text
    # below the threshold: no finding
    small = 0.9 * MEMORY_ASYMMETRY_SHARE * 22789.875
    assert find_asymmetry(ranks, None, _recorded({UUIDS[1]: small})) == ()


def _gpus(gib: list[float]) -> dict[str, GpuStats]:
    recorded = _recorded()[UUIDS[0]]
    return {f"G{i}": replace(recorded, memory_used_mib_max=1024 * g) for i, g in enumerate(gib)}


def test_pipeline_stages_are_roles_and_a_lighter_rank_of_three_is_named() -> None:
    stages = ParallelLayout(tp=1, pp=2, dp=2, order=(0, 1, 2, 3), nvlinked=None)
    [found] = find_asymmetry([_rank(i, f"G{i}") for i in range(4)], stages, _gpus([20, 20, 30, 36]))
    assert (found.rank, found.role, found.excess_gib) == (3, "pp=1", 6.0)  # stage 0 against 1: by design
    assert "than the other ranks of pipeline stage 1" in found.text
    [low] = find_asymmetry([_rank(i, f"G{i}") for i in range(3)], None, _gpus([30, 30, 20]))
    assert low.rank == 2 and low.excess_gib == -10.0 and "10.0 GiB less than its peers" in low.text


def test_ranks_sharing_a_gpu_count_its_memory_over_their_number() -> None:
    gpus = _recorded({UUIDS[1]: 22789.875})  # GPU 1 holds twice GPU 0's memory, for its two ranks
    ranks = [_rank(0, UUIDS[0]), _rank(1, UUIDS[1]), _rank(2, UUIDS[1])]
    assert find_asymmetry(ranks, None, gpus) == ()
    assert find_asymmetry([_rank(0, None), _rank(1, None)], None, gpus) == ()  # CPU ranks: nothing sampled


def _batches(ranks: int, steps: int, costly_rank: object, dropped: int = -1) -> list[wire.Batch]:
    """Steps of ``ranks`` ranks, a 10 ms forward and a sync; one rank's forward 60 % longer per step."""
    draw = random.Random(3)
    rows: list[list[tuple[float, dict[str, float]]]] = [[] for _ in range(ranks)]
    for _ in range(steps):
        slow = draw.randrange(ranks) if costly_rank == "random" else costly_rank
        for r in range(ranks):
            fwd = 0.016 if r == slow else 0.010
            rows[r].append((0.020, {"forward": fwd, "sync": 0.020 - fwd}))
    queues = [
        [
            wire.Batch(
                rank=r, steps=rows[r][i : i + 10], sync_phases=("sync",), dropped_batches=int(r == dropped and i == 30)
            )
            for i in range(0, steps, 10)
        ]
        for r in range(ranks)
    ]
    out = []  # the ranks' batches interleaved in any order, each rank's own in order (one socket each)
    mix = random.Random(5)
    while any(queues):
        out.append(mix.choice([q for q in queues if q]).pop(0))
    return out


def test_alignment_finds_variance_with_its_cost_and_the_control_is_not_variance() -> None:
    align = StepAlignment(range(4))
    for b in _batches(4, 80, "random"):
        align.add(b)
    found = align.judge()
    assert found is not None and found.variance and found.steps == 80 - 3
    assert abs(found.cost_s - 0.006) < 1e-4 and 28 < found.cost_pct < 32  # 6 ms of a 20 ms step
    assert sum(found.slowest_share.values()) == 1.0
    control = StepAlignment(range(4))
    for b in _batches(4, 80, 2):
        control.add(b)
    fixed = control.judge()
    assert fixed is not None and not fixed.variance and fixed.slowest_share[2] == 1.0
    balanced = StepAlignment(range(4))
    for b in _batches(4, 80, None):
        balanced.add(b)
    assert (j := balanced.judge()) is not None and not j.variance and j.cost_s == 0.0


def test_a_lost_batch_ends_its_ranks_alignment_and_too_few_steps_judge_nothing() -> None:
    align = StepAlignment(range(2))
    for b in _batches(2, 80, "random", dropped=1):
        align.add(b)
    found = align.judge()
    assert found is not None and found.steps == 30 - 3  # the steps before rank 1's lost batch
    short = StepAlignment(range(2))
    for b in _batches(2, MIN_STEPS + 2, "random"):
        short.add(b)
    assert short.judge() is None
    alone = StepAlignment([0])
    for b in _batches(1, 80, "random"):
        alone.add(b)
    assert alone.judge() is None


def test_the_findings_are_in_the_saved_report_and_the_exit_summary(tmp_path: Path) -> None:
    align = StepAlignment(range(4))
    for b in _batches(4, 80, "random"):
        align.add(b)
    judged = align.judge()
    assert judged is not None
    memory = find_asymmetry([_rank(0, UUIDS[0]), _rank(1, UUIDS[1])], None, _recorded({UUIDS[1]: 4096.0}))
    report = node_report(step_imbalance=StepImbalance.of(judged), memory_asymmetry=memory, stragglers=())
    path = tmp_path / "run.json"
    write_report(path, report)
    assert load_report(path) == report
    saved = json.loads(path.read_text())
    assert saved["step_imbalance"]["variance"] is True and saved["memory_asymmetry"][0]["rank"] == 1
    text = format_report(report)
    assert "per-step imbalance: no fixed straggler" in text and "length bucketing" in text
    assert "memory: rank 1 on node n0 holds 4.0 GiB more than its peers" in text
    assert to_json(load_report(DATA / "reports" / "train-2cpu-gloo.json"))["step_imbalance"] is None  # schema 4


def test_the_live_line_names_the_findings_only() -> None:
    align = StepAlignment(range(4))
    for b in _batches(4, 80, "random"):
        align.add(b)
    assert imbalance_live(align.judge()).startswith("; per-step imbalance: the slowest rank varies, 6.0 ms/step")
    control = StepAlignment(range(4))
    for b in _batches(4, 80, 2):
        control.add(b)
    assert imbalance_live(control.judge()) == "" and imbalance_live(None) == ""
    uneven = find_asymmetry([_rank(0, UUIDS[0]), _rank(1, UUIDS[1])], None, _recorded({UUIDS[1]: 4096.0}))
    assert memory_live(uneven) == "; memory: rank 1 holds 4.0 GiB more than its peers" and memory_live(()) == ""


def test_gpu_ranks_are_aligned_by_their_sampled_gpu_work() -> None:
    """Under NCCL the host does not see the kernels: every rank's CPU phases look alike, and the GPU
    work of every 5th step (CUDA events, numbered by the worker) carries the variance."""
    draw = random.Random(11)
    gpu_slow: dict[int, int] = {}  # sampled step -> the rank with the costly batch (drawn once)
    align = StepAlignment(range(2))
    for first in range(0, 200, 10):
        for r in range(2):
            gpu = []
            for step in range(first + 1, first + 11):
                if step % 5 == 0:
                    slow = draw.randrange(2) if r == 0 else gpu_slow[step]
                    gpu_slow[step] = slow
                    gpu.append((step, 0.016 if slow == r else 0.010))
            steps = [(0.020, {"forward": 0.002, "device-wait": 0.018})] * 10
            align.add(wire.Batch(rank=r, steps=steps, sync_phases=("device-wait",), gpu_busy=gpu))
    found = align.judge()
    assert found is not None and found.work_source == "gpu" and found.variance
    assert found.steps == 40  # steps 5, 10, ..., 200: all past the warm-up
    assert abs(found.cost_s - 0.006) < 1e-4 and abs(found.cost_pct - 30) < 0.5  # of the 20 ms step


def _floor(step_s: float) -> float:
    return slowdown_floor_s(5.0, step_s)


def test_a_rank_named_only_by_window_medians_under_variance_is_not_a_straggler() -> None:
    align = StepAlignment(range(2))
    for b in _batches(2, 120, "random"):
        align.add(b)
    found = align.judge()
    assert found is not None and found.variance
    assert moving_stragglers([0, 1], found, _floor, Z_SIGNIFICANT) == {0, 1}
    assert moving_stragglers([0, 1], None, _floor, Z_SIGNIFICANT) == set()  # nothing aligned: the verdict stands


def test_a_fixed_straggler_under_variance_stays_named() -> None:
    """Rank 1 always 2 ms slower, and a random rank's batch 6 ms costlier at every step."""
    draw = random.Random(4)
    align = StepAlignment(range(4))
    rows: list[list[tuple[float, dict[str, float]]]] = [[] for _ in range(4)]
    for _ in range(120):
        slow = draw.randrange(4)
        for r in range(4):
            fwd = 0.010 + (0.006 if r == slow else 0.0) + (0.002 if r == 1 else 0.0)
            rows[r].append((0.020, {"forward": fwd, "sync": 0.020 - fwd}))
    for first in range(0, 120, 10):
        for r in range(4):
            align.add(wire.Batch(rank=r, steps=rows[r][first : first + 10], sync_phases=("sync",)))
    found = align.judge()
    assert found is not None and found.variance  # the cost moves: variance, and ...
    assert moving_stragglers([1], found, _floor, Z_SIGNIFICANT) == set()  # ... rank 1 is a straggler too
    assert found.excess_s[1] > 0.002
