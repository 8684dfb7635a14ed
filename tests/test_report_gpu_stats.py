"""The report's GPU entry as the statistics helper hands it over: the sampler's summary (stats/gpu.py),
sent over the helper's link in the codec's JSON, is the type the report holds."""

from __future__ import annotations

import json

from openclaw_launch.codec import from_json, to_json
from openclaw_launch.stats.gpu import GpuSummary
from openclaw_launch.stats.result import GpuStats


def test_a_gpu_summary_with_clock_event_reasons_crosses_the_link_as_the_reports_type() -> None:
    """A GPU host's run once built its report from such a summary and failed (a tuple where the codec
    takes JSON's list): every GPU run with telemetry exited 1 after its workers ended."""
    summary = GpuSummary()
    for reasons in (0.0, 4.0):
        summary.add({"util_pct": 95.0, "sm_clock_mhz": 1980, "power_w": 650.0, "clock_event_reasons": reasons})
    sent = json.loads(json.dumps(to_json(summary.stats())))  # as run/helper.py's link carries it
    stats = from_json(GpuStats, sent)
    assert stats == summary.stats() and stats.clock_event_reasons == ("sw_power_cap",)
    assert stats.samples == 2 and stats.sm_clock_mhz_min == 1980.0 and stats.temp_c_max is None
    assert GpuSummary().stats().clock_event_reasons == ()
