"""Launcher side of the statistics: bounded distributions, the collector and the verdict (pure)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from openclaw_launch.report.build import straggler_entry
from openclaw_launch.report.format import format_verdict
from openclaw_launch.stats.collect import WARMUP_STEPS, Collector, RankSummary
from openclaw_launch.stats.gpu import GpuSampler, GpuSummary, RecordedSource
from openclaw_launch.stats.histogram import LogHistogram
from openclaw_launch.stats.result import GpuStats
from openclaw_launch.stats.verdict import RankFacts, find_stragglers, sync_bound
from openclaw_launch.telemetry import wire


def test_histogram_quantiles_are_within_two_percent_and_memory_is_bounded() -> None:
    rng = random.Random(1)
    values = [rng.lognormvariate(-3, 0.5) for _ in range(100_000)]
    hist = LogHistogram()
    for v in values:
        hist.add(v)
    values.sort()
    for q in (0.5, 0.9, 0.99):
        exact = values[int(q * (len(values) - 1))]
        assert hist.quantile(q) == pytest.approx(exact, rel=0.02)
    assert hist.max == values[-1] and len(hist._buckets) < 400


def _batch(rank: int, steps: int, step_s: float, phases: dict[str, float], **kw: object) -> bytes:
    return wire.encode(wire.Batch(rank=rank, steps=[(step_s, dict(phases))] * steps, **kw))  # type: ignore[arg-type]


def _ranks(per_rank: dict[int, dict[str, float]], step_s: float = 0.1, **kw: object) -> list[RankSummary]:
    collector = Collector()
    for rank, phases in per_rank.items():
        collector.feed(_batch(rank, 20, step_s, phases, **kw))
    return collector.summaries()


DDP = {"sync_phases": ("backward", "collective", "sync")}


def test_collector_skips_warm_up_and_charges_the_rest_to_other() -> None:
    [summary] = _ranks({0: {"input": 0.02, "forward": 0.03}})
    assert summary.steps == 20 and summary.measured_steps == 20 - WARMUP_STEPS
    assert summary.phases["other"].mean_s == pytest.approx(0.05, rel=0.02)
    assert summary.phases["input"].share == pytest.approx(0.2, rel=0.02)


def test_input_straggler_is_named_with_its_phase() -> None:
    # rank 2 spends 10 ms more in input; the others wait those 10 ms in backward (DDP)
    normal = {"input": 0.02, "forward": 0.03, "backward": 0.04}
    slow = {"input": 0.03, "forward": 0.03, "backward": 0.03}
    ranks = _ranks({0: normal, 1: normal, 2: slow, 3: normal}, **DDP)
    [s] = find_stragglers(ranks, {r: RankFacts(node="a") for r in range(4)})
    assert (s.rank, s.phase, s.section, s.node) == (2, "input", "input", "a")
    assert s.excess_s == pytest.approx(0.01, rel=0.05) and s.excess_pct == pytest.approx(10, rel=0.05)
    assert s.peers_wait_s == pytest.approx(0.01, rel=0.05)
    assert "input/host stage (the DataLoader) +10.0 ms/step" in format_verdict(straggler_entry(s), 0.1)


def test_compute_straggler_is_named_with_its_phase() -> None:
    normal = {"input": 0.02, "forward": 0.03, "backward": 0.04}
    slow = {"input": 0.02, "forward": 0.04, "backward": 0.03}
    [s] = find_stragglers(_ranks({0: normal, 1: slow}, **DDP), {})
    assert (s.rank, s.phase, s.section) == (1, "compute", "forward")


def test_balanced_ranks_have_no_straggler_and_one_below_threshold_is_not_named() -> None:
    normal = {"input": 0.02, "forward": 0.03, "backward": 0.04}
    assert find_stragglers(_ranks({0: normal, 1: normal, 2: normal}, **DDP), {}) == []
    slightly = {"input": 0.024, "forward": 0.03, "backward": 0.036}  # 4 % of the step
    assert find_stragglers(_ranks({0: normal, 1: slightly}, **DDP), {}) == []
    assert find_stragglers(_ranks({0: normal, 1: slightly}, **DDP), {}, threshold_pct=3) != []


def test_gpu_wait_from_the_flight_recorder_names_a_compute_straggler() -> None:
    # As measured on 2x H200: the slow rank's NCCL time is a fraction of the others'
    collector = Collector()
    collector.feed(_batch(0, 20, 0.1015, {"input": 0.001}, gpu_steps=20, gpu_sync_s=20 * 0.061, gpu_late_s=20 * 0.034))
    collector.feed(_batch(1, 20, 0.1015, {"input": 0.001}, gpu_steps=20, gpu_sync_s=20 * 0.004, gpu_late_s=20 * 0.001))
    [s] = find_stragglers(collector.summaries(), {})
    assert (s.rank, s.phase, s.section, s.wait_source) == (1, "compute", "gpu", "nccl-flight-recorder")
    assert s.excess_s == pytest.approx(0.033)  # from the longest collective per step, not their sum


def test_everyone_waiting_is_the_fabric_not_a_rank() -> None:
    waiting = {"input": 0.01, "sync": 0.05}
    ranks = _ranks({0: waiting, 1: waiting}, sync_phases=("sync",))
    assert find_stragglers(ranks, {}) == [] and sync_bound(ranks) == pytest.approx(0.5, rel=0.02)


def test_a_single_rank_or_too_few_steps_gives_no_verdict() -> None:
    assert find_stragglers(_ranks({0: {"input": 0.05}}), {}) == []
    collector = Collector()
    collector.feed(_batch(0, 4, 0.1, {"input": 0.01}))
    collector.feed(_batch(1, 4, 0.1, {"input": 0.09}))
    assert find_stragglers(collector.summaries(), {}) == []


def _gpu(sm_clock_mhz_mean: float, memory_used_mib_max: float, clock_event_reasons: tuple[str, ...] = ()) -> GpuStats:
    """A GPU summary with these values and no other."""
    return replace(
        GpuSummary().stats(),
        samples=10,
        sm_clock_mhz_mean=sm_clock_mhz_mean,
        memory_used_mib_max=memory_used_mib_max,
        clock_event_reasons=clock_event_reasons,
    )


def test_gpu_hints_name_clocks_throttling_and_memory() -> None:
    normal = {"input": 0.02, "forward": 0.03, "backward": 0.04}
    slow = {"input": 0.02, "forward": 0.04, "backward": 0.03}
    ranks = _ranks({0: normal, 1: slow}, **DDP)
    facts = {
        0: RankFacts("a", gpu=_gpu(sm_clock_mhz_mean=1980.0, memory_used_mib_max=40000.0)),
        1: RankFacts(
            "a",
            gpu=_gpu(sm_clock_mhz_mean=1600.0, memory_used_mib_max=60000.0, clock_event_reasons=("sw_power_cap",)),
            binding_warning="rank 1 runs on CPUs 0-3 but the plan says 8-11",
        ),
    }
    [s] = find_stragglers(ranks, facts)
    text = " | ".join(s.hints)
    for expected in ("1600 MHz vs 1980 MHz", "sw_power_cap", "58.6 GiB vs 39.1 GiB", "affinity"):
        assert expected in text


def test_window_covers_only_the_steps_since_the_last_call() -> None:
    collector = Collector()
    collector.feed(_batch(0, 20, 0.1, {"input": 0.01}))
    assert collector.window()[0].measured_steps == 20 - WARMUP_STEPS
    collector.feed(_batch(0, 10, 0.2, {"input": 0.01}))
    [window] = collector.window()
    assert window.measured_steps == 10 and window.step_mean_s == pytest.approx(0.2)
    assert collector.summaries()[0].steps == 30


def test_gpu_sampler_summarises_replayed_samples() -> None:
    samples = {
        "GPU-a": [
            {"util_pct": 90.0, "sm_clock_mhz": 1980.0, "power_w": 500.0, "temp_c": 60.0, "clock_event_reasons": 0.0},
            {"util_pct": 100.0, "sm_clock_mhz": 1900.0, "power_w": 600.0, "temp_c": 65.0, "clock_event_reasons": 4.0},
        ]
    }
    sampler = GpuSampler(RecordedSource(samples), ["GPU-a", "GPU-missing"], interval_s=0.01).start()
    while sampler.summaries()["GPU-a"].samples < 4:
        pass
    sampler.stop()
    summary = sampler.summaries()["GPU-a"]
    assert summary.sm_clock_mhz_min == 1900.0 and summary.temp_c_max == 65.0
    assert summary.clock_event_reasons == ("sw_power_cap",) and summary.memory_used_mib_max is None
    assert sampler.summaries()["GPU-missing"] == GpuSummary().stats()


def test_gpu_ranks_without_the_flight_recorder_still_name_a_slow_input_stage() -> None:
    """Per-step means (ms) of the 2x H200 run with rank 1's DataLoader 20 ms slower
    (benchmarks/results/2026-12-01-h200x2-straggler-final/input-hooks.json): the CPU does not wait
    in NCCL, so no wait signal tells the ranks apart, but the input stage does."""
    rank0 = {"backward": 0.02117, "forward": 0.01046, "input": 0.0007, "optimizer": 0.00109}
    rank1 = {"backward": 0.02438, "forward": 0.01234, "input": 0.02092, "optimizer": 0.00125}
    ranks = _ranks({0: rank0, 1: rank1}, step_s=0.0885)
    [s] = find_stragglers(ranks, {})
    assert (s.rank, s.phase, s.wait_source) == (1, "input", "none")
    assert s.excess_s == pytest.approx(0.0202, rel=0.01)


def test_backward_under_ddp_is_not_counted_as_everyone_waiting() -> None:
    """DDP's backward holds the gradient all-reduce but also the backward compute: a job whose ranks
    spend most of the step in backward is not "bound by synchronisation"."""
    ranks = _ranks({0: {"backward": 0.08}, 1: {"backward": 0.08}}, **DDP)
    assert sync_bound(ranks) is None


def _noisy_ranks(slow_ms: float, seed: int, steps: int = 200) -> list[RankSummary]:
    """Four ranks of a 26 ms step on a loaded host: input 8 ms, compute 12 ms, the rest waiting in
    sync; every phase of every step jittered (lognormal) and one step in ten stalled by 0-8 ms.
    Rank 3's input is ``slow_ms`` longer; the others wait that much longer in sync."""
    rng = random.Random(seed)
    collector = Collector()
    for rank in range(4):
        batch = []
        for _ in range(steps):
            jitter = lambda ms: ms / 1000 * rng.lognormvariate(0, 0.08)  # noqa: E731
            stall = rng.uniform(0, 0.008) if rng.random() < 0.1 else 0.0
            input_s = jitter(8 + (slow_ms if rank == 3 else 0)) + stall * (rank == 3)
            compute_s = jitter(12) + stall * (rank != 3)
            sync_s = 0.003 + (slow_ms / 1000 if rank != 3 else 0.0) + rng.uniform(0, 0.0005)
            batch.append((input_s + compute_s + sync_s, {"input": input_s, "compute": compute_s, "sync": sync_s}))
        collector.add(wire.Batch(rank=rank, steps=batch, sync_phases=("sync",)))
    return collector.summaries()


def test_windows_name_a_5_percent_slowdown_through_noise_and_never_a_balanced_rank() -> None:
    """A slowdown of 1.3 ms (5 % of the 26 ms step) is named with its phase in 20 of 20 noisy runs,
    none of 20 balanced runs names anyone, and 0.5 ms (2 %) is never named."""
    for seed in range(20):
        [s] = find_stragglers(_noisy_ranks(1.3, seed), {})
        assert (s.rank, s.phase, s.section) == (3, "input", "input")
        assert find_stragglers(_noisy_ranks(0.0, 100 + seed), {}) == []
        assert find_stragglers(_noisy_ranks(0.5, 200 + seed), {}) == []


def test_the_threshold_is_a_slowdown_of_the_job_against_the_others_pace() -> None:
    """A rank that makes a 100 ms step 5 % longer than the others' 95.24 ms pace (4.76 ms, 4.76 % of
    the step it produces; here 4.8 ms) is named at 5 %, and so is one 4.5 % slower (the margin:
    4.31 ms); one 4.2 % of the step (4.4 % slower) is not."""
    normal = {"input": 0.02, "forward": 0.03, "backward": 0.05}
    for excess_s, named in ((0.0048, True), (0.0044, True), (0.0042, False)):
        slow = {"input": 0.02 + excess_s, "forward": 0.03, "backward": 0.05 - excess_s}
        found = find_stragglers(_ranks({0: normal, 1: normal, 2: slow}, **DDP), {})
        assert bool(found) is named, (excess_s, found)
