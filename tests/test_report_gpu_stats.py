"""The report's GPU entry from a sampled summary as the statistics helper hands it over (stats/gpu.py)."""

from __future__ import annotations

from openclaw_launch.report.build import gpu_stats


def test_a_gpu_summary_with_clock_event_reasons_becomes_the_reports_type() -> None:
    """A GPU host's run built its report from such a summary and failed (a tuple where the codec
    takes JSON's list): every GPU run with telemetry exited 1 after its workers ended."""
    summary = {
        "samples": 4,
        "util_pct_mean": 97.5,
        "sm_clock_mhz_mean": 1980.0,
        "power_w_mean": 650.0,
        "clock_event_reasons": ["sw_power_cap"],
    }
    stats = gpu_stats(summary)
    assert stats.clock_event_reasons == ("sw_power_cap",)
    assert stats.samples == 4 and stats.temp_c_max is None
    assert gpu_stats({"samples": 1}).clock_event_reasons == ()
