"""Draw a saved run report: where each rank's step went, and how its step time spreads.

The table says *which* rank straggles; a picture makes *why* obvious at a glance (one rank's input
bar where the others have a long grey "waiting" bar). The bars split each step as the table does
(``stats.phases.split``): the input/host phases, the work phases (a wait phase's own part, such as
backward's compute under DDP, is work: "own part"), then the time the rank waited for the others.
matplotlib is an optional extra, imported only here, with the Agg canvas so no display, no pyplot
and no global backend switch is involved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from openclaw_launch.errors import OpenclawError
from openclaw_launch.stats import phases
from openclaw_launch.stats.judged import excess_text

if TYPE_CHECKING:
    from openclaw_launch.report.model import JobReport, NodeReport
    from openclaw_launch.report.rank import StepStatistics

WAITING = "waiting for other ranks"


@dataclass(frozen=True)
class Segment:
    name: str  # a phase, "<phases> (own part)" or WAITING
    kind: str  # phases.INPUT, phases.WORK or phases.WAIT
    seconds: float  # mean per step


def segments(stats: StepStatistics) -> list[Segment]:
    """One rank's bar: input phases, work phases scaled to the split's work, the wait; the kinds add
    up to exactly the split the table prints."""
    means = {name: sec.mean for name, sec in stats.sections.items()}
    cut = phases.split(stats.step_time_s.mean, means, stats.wait_s)
    sync = set(stats.sync_sections)
    out = [Segment(n, phases.INPUT, means[n]) for n in phases.INPUT_PHASES if means.get(n)]
    work = [(n, v) for n, v in means.items() if phases.kind(n, sync) == phases.WORK]
    in_wait_phases = sum(v for n, v in means.items() if n in sync)
    if in_wait_phases > cut.wait_s:
        work.append((f"{', '.join(sorted(sync & set(means)))} (own part)", in_wait_phases - cut.wait_s))
    total = sum(v for _, v in work)
    scale = cut.work_s / total if total > 0 else 0.0
    out += [Segment(n, phases.WORK, v * scale) for n, v in work if v > 0]
    if cut.wait_s > 0:
        out.append(Segment(WAITING, phases.WAIT, cut.wait_s))
    return out


_STRAGGLER = "tab:red"
_WAIT = "0.78"


def plot_report(report: NodeReport | JobReport, path: str) -> None:
    """Write a PNG (or any format matplotlib knows from the suffix) of ``report`` (as ``load_report``
    reads it) to ``path``."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
        from matplotlib.transforms import offset_copy
    except ImportError:
        raise OpenclawError("--plot needs matplotlib: pip install 'openclaw-launch[plot]'") from None

    ranks = [r for r in report.ranks if r.statistics is not None and r.statistics.measured_steps]
    if report.statistics is None or not ranks:
        raise OpenclawError(
            "--plot: this report has no step statistics (run with a telemetry-enabled worker: "
            "telemetry.step(), or torch with an optimizer or DataLoader)"
        )
    ranks.sort(key=lambda r: r.rank)
    steps = {r.rank: r.statistics for r in ranks if r.statistics is not None}
    stragglers = {s.rank: s for s in report.stragglers}
    multi_node = len({r.node for r in ranks}) > 1
    labels = [f"rank {r.rank}" + (f"\n{r.node}" if multi_node else "") for r in ranks]

    bars = [segments(st) for st in steps.values()]
    names: list[str] = []
    for bar in bars:
        names += [seg.name for seg in bar if seg.kind != phases.WAIT and seg.name not in names]
    palette = ["tab:orange", "tab:blue", "tab:green", "tab:purple", "tab:brown", "tab:olive", "tab:cyan", "tab:pink"]
    colours = {n: palette[i % len(palette)] for i, n in enumerate(names)}

    height = max(3.0, 0.45 * len(ranks) + 1.8)
    fig = Figure(figsize=(12, height), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 2]})

    widest = 0.0
    for y, bar in enumerate(bars):
        x = 0.0
        for seg in bar:
            width = 1000 * seg.seconds
            if seg.kind == phases.WAIT:
                left.barh(y, width, left=x, color=_WAIT, hatch="///", edgecolor="0.45", linewidth=0.5)
            else:
                left.barh(y, width, left=x, color=colours[seg.name], edgecolor="white", linewidth=0.5)
            x += width
        widest = max(widest, x)
    handles = [Patch(color=colours[n], label=n) for n in names]
    if any(seg.kind == phases.WAIT for bar in bars for seg in bar):
        handles.append(Patch(facecolor=_WAIT, hatch="///", edgecolor="0.45", label=WAITING))
    below = offset_copy(left.transAxes, fig=fig, y=-30, units="points")  # under the tick labels and x label
    left.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, 0),
        bbox_transform=below,
        frameon=False,
        ncol=min(len(handles), 6),
        fontsize="small",
    )
    left.set_xlim(0, 1.04 * widest or 1.0)
    left.set_xlabel("mean time per step: input/host, work, waiting (ms)")
    left.set_title("where the step goes", fontsize="medium")

    for y, (rank, st) in enumerate(steps.items()):
        p50, p90, p99 = (1000 * st.step_time_s.p50, 1000 * st.step_time_s.p90, 1000 * st.step_time_s.p99)
        colour = _STRAGGLER if rank in stragglers else "tab:blue"
        right.hlines(y, p90, p99, color=colour, linewidth=1.2)
        right.hlines(y, p50, p90, color=colour, linewidth=4, alpha=0.6)
        right.plot([p99], [y], marker="|", markersize=10, color=colour)
        right.plot([p50], [y], marker="o", color=colour)
    right.set_xlim(left=0)
    right.set_xlabel("step time (ms): p50 dot, p90 thick bar, p99 whisker")
    right.set_title("step time spread", fontsize="medium")
    right.grid(axis="x", alpha=0.3)

    left.set_yticks(range(len(ranks)), labels)
    left.invert_yaxis()  # rank 0 on top, as in the table
    for tick, r in zip(left.get_yticklabels(), ranks, strict=True):
        if r.rank in stragglers:
            tick.set_color(_STRAGGLER)
            tick.set_fontweight("bold")

    if stragglers:
        verdict = "; ".join(
            f"straggler rank {s.rank} ({s.node}): {'input/host' if s.phase == phases.INPUT else s.phase} stage "
            f"({s.section}) +{1000 * s.excess_s:.1f} ms/step ({excess_text(s.excess_pct, s.pct_of)})"
            for s in stragglers.values()
        )
    else:
        verdict = "no straggler"
    fig.suptitle(
        f"run {report.run_id}, {report.world_size} ranks: {verdict}",
        color=_STRAGGLER if stragglers else "black",
    )
    try:
        fig.savefig(path, dpi=110)
    except (OSError, ValueError) as e:
        raise OpenclawError(f"cannot write plot {path}: {getattr(e, 'strerror', None) or e}") from None
